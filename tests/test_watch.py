"""Health signals (`jaxdl.train.watch`): their maths against numpy, the largest attention logit
against an explicit loop, the doctor's rule on them, and the settings' errors. A watched run
end to end is checked in test_throughput.py (it shares that file's GPT run)."""

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl.config import ConfigError, load_config
from jaxdl.doctor import diagnose_history
from jaxdl.models.attention import max_attention_logit
from jaxdl.train import make_task, watch


def test_health_vector_is_per_group_and_per_layer_norms_on_watched_steps_only():
  rng = np.random.default_rng(0)
  tree = lambda: {"wte": {"embedding": rng.normal(size=(5, 3))},  # noqa: E731
                  "h": {"k": rng.normal(size=(2, 3, 3)), "b": rng.normal(size=(2, 3))},
                  "ln_f": {"scale": rng.normal(size=(3,))}}
  params, grads, new = tree(), tree(), tree()
  model = SimpleNamespace(n_layer=2, scan_layers=True)
  names, health = watch.make_health(params, model, every=4)
  fn = jax.jit(health)
  vec = dict(zip(names, np.asarray(fn(jnp.int32(3), params, grads, new))))   # update 4
  norm = lambda *xs: math.sqrt(sum(float(np.sum(np.square(x))) for x in xs))  # noqa: E731
  for i in range(2):
    layer = lambda t: (t["h"]["k"][i], t["h"]["b"][i])  # noqa: E731
    np.testing.assert_allclose(vec[f"param_norm/h/{i}"], norm(*layer(new)), rtol=1e-6)
    np.testing.assert_allclose(vec[f"grad_norm/h/{i}"], norm(*layer(grads)), rtol=1e-6)
    delta = [a - b for a, b in zip(layer(new), layer(params))]
    np.testing.assert_allclose(vec[f"update_ratio/h/{i}"], norm(*delta) / norm(*layer(params)),
                               rtol=1e-5)
  np.testing.assert_allclose(vec["grad_norm/wte"], norm(grads["wte"]["embedding"]), rtol=1e-6)
  assert len(names) == 3 * 4   # wte, h/0, h/1, ln_f
  assert not np.any(np.asarray(fn(jnp.int32(4), params, grads, new)))     # update 5: skipped


@pytest.mark.parametrize("causal", [False, True])
def test_max_attention_logit_matches_an_explicit_loop(causal):
  rng = np.random.default_rng(1)
  q, k = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 5, 3, 4))
  mask = rng.random((2, 1, 5, 5)) > 0.3
  mask[..., 0] = True   # every query sees something
  best = -np.inf
  for b, t, s, h in np.ndindex(2, 5, 5, 3):
    if mask[b, 0, t, s] and (s <= t or not causal):
      best = max(best, float(q[b, t, h] @ k[b, s, h]) / 2.0)  # sqrt(d_head = 4)
  got = max_attention_logit(jnp.asarray(q), jnp.asarray(k), jnp.asarray(mask), causal=causal)
  np.testing.assert_allclose(float(got), best, rtol=1e-5)


def _history(logits, spike_at):
  """Watch records every 5 steps with the given largest logits; the loss spikes at spike_at."""
  train = [{"step": s, "loss": 20.0 if s == spike_at else 3.0 - 0.001 * s}
           for s in range(1, 5 * len(logits) + 1)]
  watched = [{"step": 5 * (i + 1), "split": "watch", "attn_max_logit/h/0": a,
              "attn_max_logit/h/1": a / 2} for i, a in enumerate(logits)]
  return train, watched


def test_doctor_names_growing_attention_logits_before_the_loss_spike():
  # The numbers of a planted run: char_gpt shrunk, lr 0.03 constant, no qk-norm (layer 0's
  # largest logit 2.3 at step 5 -> 77.6 at step 20 -> 1226 at 150; with qk-norm <= 10.4).
  train, watched = _history([2.3, 12.7, 45.8, 77.6, 68.8, 98.4, 210.2, 252.6], spike_at=38)
  found = {d.symptom: d for d in diagnose_history(train, watch=watched)}
  assert found["attn_logits"].step == 20 < found["spike"].step == 38
  assert "77.6" in found["attn_logits"].evidence
  train, watched = _history([4.2, 4.6, 4.7, 5.0, 5.9, 6.5, 6.4, 6.9], spike_at=38)
  assert "attn_logits" not in {d.symptom for d in diagnose_history(train, watch=watched)}


def test_watch_settings_are_checked():
  for override, expected in (("train.watch_every=0", r"^train.watch_every: must be > 0"),
                             ("train.watch='loud'", r"^train.watch: expected one of 'off'")):
    with pytest.raises(ConfigError, match=expected):
      load_config("moons_mlp", [override])


def test_z_loss_is_the_coefficient_times_the_mean_squared_log_normalizer():
  rng = np.random.default_rng(2)
  logits_BxTxV = rng.normal(size=(2, 3, 5)).astype(np.float32) * 3.0
  batch = {"x": jnp.asarray(logits_BxTxV), "y": jnp.asarray(rng.integers(0, 5, (2, 3))),
           "mask": jnp.asarray([1.0, 0.0])}   # the second sequence is padding

  def loss(coef, train):
    task = make_task(ml_collections.ConfigDict({"task": "lm", "train": {"z_loss": coef}}))
    # The "model" returns its input (and no sown collections when they are asked for).
    apply_fn = lambda variables, x, train, mutable=None, **kw: (x, {}) if mutable else x  # noqa
    out, (metrics, _) = task.loss_fn(apply_fn, {}, {}, batch, {"dropout": jax.random.PRNGKey(0)},
                                     train)
    return float(out), metrics

  log_z = np.log(np.exp(logits_BxTxV[0].astype(np.float64)).sum(-1))   # the real sequence
  expected = 1e-2 * float(np.mean(log_z ** 2))
  plain, metrics = loss(0.0, True)
  with_z, metrics = loss(1e-2, True)
  np.testing.assert_allclose(float(metrics["z_loss"]), expected, rtol=1e-5)
  np.testing.assert_allclose(with_z - plain, expected, rtol=1e-4)
  assert expected > 1e-3                        # large enough for the check above to mean it
  assert loss(1e-2, False)[0] == plain          # evaluation reports the plain cross-entropy
  with pytest.raises(ConfigError, match=r"^train.z_loss: must be >= 0"):
    load_config("char_gpt", ["train.z_loss=-1.0"])
  with pytest.raises(ValueError, match=r"^train.z_loss: only language-model tasks"):
    make_task(ml_collections.ConfigDict({"task": "classification", "train": {"z_loss": 1e-4}}))


def test_dead_relu_fraction_per_layer_on_a_planted_mlp():
  from jaxdl.models.mlp import MLP
  model = MLP(hidden=(6, 4), out=3)
  x_BxD = np.random.default_rng(3).normal(size=(8, 5)).astype(np.float32)
  params = jax.tree.map(np.array, model.init(jax.random.PRNGKey(0), x_BxD, train=False))
  params = params["params"]
  params["dense_0"]["bias"][:3] = -100.0   # units 0-2 of layer 0 never fire: 3 of 6 dead
  params["dense_1"]["bias"][:] = -100.0    # every unit of layer 1 is dead
  task = SimpleNamespace(init_input=lambda batch: batch["x"])
  probe = watch.make_probe(model, task)
  got = jax.jit(lambda p, b: probe(SimpleNamespace(params=p, model_state={}), b))(
      params, {"x": x_BxD})
  h0_BxH = x_BxD @ params["dense_0"]["kernel"] + params["dense_0"]["bias"]
  expected0 = float(np.mean(np.all(h0_BxH <= 0, axis=0)))   # numpy, from the weights
  assert expected0 >= 0.5
  np.testing.assert_allclose(float(got["dead_relu/dense_0"]), expected0)
  assert float(got["dead_relu/dense_1"]) == 1.0
  # The probe's forward is the model's: the same logits.
  logits = model.apply({"params": params}, x_BxD, train=False)
  np.testing.assert_allclose(float(got["logit_max"]), float(np.max(logits)), rtol=1e-6)
  # ... which the doctor names from the watch records.
  watched = [{"step": 5, "split": "watch", "dead_relu/dense_0": 0.1, "dead_relu/dense_1": 0.2},
             {"step": 10, "split": "watch", "dead_relu/dense_0": expected0,
              "dead_relu/dense_1": float(got["dead_relu/dense_1"])}]
  train = [{"step": s, "loss": 1.0 - 0.01 * s} for s in range(1, 11)]
  found = {d.symptom: d for d in diagnose_history(train, watch=watched)}
  assert found["dead_relus"].step == 10 and "dense_1 100%" in found["dead_relus"].evidence
  watched[-1]["dead_relu/dense_1"] = watched[-1]["dead_relu/dense_0"] = 0.25
  assert "dead_relus" not in {d.symptom for d in diagnose_history(train, watch=watched)}


def test_the_probe_under_pmap_reads_the_whole_batch_not_device_0():
  """The detailed probe pmapped over 4 devices (B / 4 rows each) gives the whole batch's signals,
  as one jitted call on all B rows does. Planted so that device 0's rows differ: a unit that
  fires only on the last device's rows is not dead, the largest logit is on that device, and
  the logits' std is the whole batch's."""
  from jaxdl.models.mlp import MLP
  from jaxdl.train.pmap import PmapStrategy
  devices = jax.local_devices()[:4]
  assert len(devices) == 4
  model = MLP(hidden=(6,), out=3)
  x_BxD = np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32)
  x_BxD[:12, 0] = -1.0
  x_BxD[12:, 0] = 5.0                       # the last device's 4 rows only
  params = jax.tree.map(np.array, model.init(jax.random.PRNGKey(0), x_BxD, train=False))["params"]
  params["dense_0"]["kernel"][:, 0] = 0.0
  params["dense_0"]["kernel"][0, 0] = 1.0   # unit 0 fires on x[:, 0] > 1: the last device only
  params["dense_0"]["bias"][0] = -1.0
  params["dense_0"]["bias"][1:] = -100.0    # units 1-5 never fire
  task = SimpleNamespace(init_input=lambda batch: batch["x"])

  def probe_of(axis_name=None):
    probe = watch.make_probe(model, task, axis_name)
    return lambda p, b: probe(SimpleNamespace(params=p, model_state={}), b)

  whole = jax.jit(probe_of())(params, {"x": x_BxD})
  strategy = PmapStrategy(devices)
  pmapped = strategy.compile_eval(probe_of(strategy.axis_name), None)
  stacked = jax.tree.map(lambda v: np.broadcast_to(v, (4, *v.shape)), params)
  sharded = strategy.first(pmapped(stacked, strategy.shard_batch({"x": x_BxD})))
  assert float(whole["dead_relu/dense_0"]) == pytest.approx(5 / 6)
  for k in whole:
    np.testing.assert_allclose(float(sharded[k]), float(whole[k]), rtol=1e-5, err_msg=k)
  alone = jax.jit(probe_of())(params, {"x": x_BxD[:4]})
  assert float(alone["dead_relu/dense_0"]) == 1.0   # device 0's rows alone would say all dead
