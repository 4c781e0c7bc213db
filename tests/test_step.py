"""The pure train and eval steps: jit vs eager, metrics, randomness, loss scaling."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxdl.models.mlp import MLP
from jaxdl.optim import precision
from jaxdl.train import create_train_state, make_eval_step, make_train_step, make_task, step_rngs
from jaxdl.train.token_losses import smoothed_targets


def _setup(task="classification", dropout=0.0, norm="none", clip=None, smoothing=0.0):
  config = ml_collections.ConfigDict(dict(task=task, train=dict(label_smoothing=smoothing)))
  model = MLP(hidden=(16, 16), out=3 if task == "classification" else 1, norm=norm,
              dropout=dropout)
  tx = optax.chain(*([optax.clip_by_global_norm(clip)] if clip else []), optax.sgd(0.1))
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(8, 2)).astype(np.float32),
           "y": rng.integers(0, 3, size=8).astype(np.int32)}
  state = create_train_state(model, tx, jax.random.PRNGKey(0), batch["x"])
  return model, make_task(config), tx, state, batch


def test_jit_matches_eager_over_steps():
  model, task, tx, state, batch = _setup(dropout=0.2, norm="batch")
  eager = make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.1),
                          jax.random.PRNGKey(1))
  jitted = make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.1),
                           jax.random.PRNGKey(1), jit=True)
  s_eager = state
  s_jit = jax.tree.map(jnp.copy, state)  # the jitted step donates its input
  for _ in range(3):
    s_eager, m_eager = eager(s_eager, batch)
    s_jit, m_jit = jitted(s_jit, batch)
    np.testing.assert_allclose(m_eager["loss"], m_jit["loss"], rtol=1e-5)
  chex_close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree.map(chex_close, s_eager.params, s_jit.params)
  jax.tree.map(chex_close, s_eager.model_state, s_jit.model_state)
  assert int(s_jit.step) == 3


def test_grad_norm_is_measured_before_clipping():
  model, task, tx, state, batch = _setup(clip=1e-3)
  # Jitted without donation (one compile; eager, every op compiles on its own).
  step = jax.jit(make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.1),
                                 jax.random.PRNGKey(1)))

  def loss_of(params):  # the task loss written out: mean softmax cross-entropy
    logits = model.apply({"params": params}, batch["x"], train=False)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(logp[jnp.arange(8), batch["y"]])

  grads = jax.jit(jax.grad(loss_of))(state.params)
  expected_norm = np.sqrt(sum(np.sum(np.square(g)) for g in jax.tree.leaves(grads)))
  new_state, metrics = step(state, batch)
  np.testing.assert_allclose(metrics["grad_norm"], expected_norm, rtol=1e-5)
  assert float(expected_norm) > 1e-2  # so clipping to 1e-3 really bites
  # With clipping at c, the SGD update has norm lr * c.
  delta = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new_state.params,
                       state.params)
  update_norm = np.sqrt(sum(np.sum(np.square(d)) for d in jax.tree.leaves(delta)))
  np.testing.assert_allclose(update_norm, 0.1 * 1e-3, rtol=1e-4)
  np.testing.assert_allclose(metrics["lr"], 0.1)


def test_label_smoothing_targets_exact():
  y = jnp.array([0, 2])
  got = smoothed_targets(y, 4, 0.1)
  want = np.array([[0.925, 0.025, 0.025, 0.025], [0.025, 0.025, 0.925, 0.025]])
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_rng_streams_derived_from_step_only():
  key = jax.random.PRNGKey(3)
  a, b, c = step_rngs(key, 5), step_rngs(key, 5), step_rngs(key, 6)
  assert set(a) == {"dropout", "noise", "time", "label_drop"}
  assert all(np.array_equal(jax.random.key_data(a[k]), jax.random.key_data(b[k])) for k in a)
  assert not np.array_equal(jax.random.key_data(a["dropout"]), jax.random.key_data(c["dropout"]))
  assert not np.array_equal(jax.random.key_data(a["dropout"]), jax.random.key_data(a["noise"]))


def test_eval_step_padding_mask_gives_exact_mean():
  model, task, tx, state, batch = _setup()
  eval_step = make_eval_step(model.apply, task.loss_fn, jit=True)
  full = eval_step(state, batch)
  # The same 8 examples as 5 + 3 real rows, the second batch padded to 5 with masked junk.
  first = {k: v[:5] for k, v in batch.items()}
  first["mask"] = np.ones(5, np.float32)
  second = {k: np.concatenate([v[5:], v[:2]]) for k, v in batch.items()}
  second["mask"] = np.array([1, 1, 1, 0, 0], np.float32)
  a, b = eval_step(state, first), eval_step(state, second)
  for k in ("loss", "accuracy"):
    np.testing.assert_allclose((a[k] + b[k]) / (a["count"] + b["count"]),
                               full[k] / full["count"], rtol=1e-5)


def test_fp16_overflow_skips_step_and_halves_scale():
  model, task, tx, state, batch = _setup(task="regression")
  batch = {"x": batch["x"], "y": np.zeros((8, 1), np.float32)}
  state = state.replace(loss_scale=precision.DynamicLossScale.create(init_scale=2.0 ** 15,
                                                                     period=2))
  step = make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.1),
                         jax.random.PRNGKey(1), jit=True)
  huge = {"x": batch["x"] * 1e36, "y": batch["y"]}  # S * loss overflows float32
  before = jax.tree.map(np.asarray, state.params)
  state, metrics = step(state, huge)
  assert float(metrics["grads_finite"]) == 0.0
  assert float(state.loss_scale.scale) == 2.0 ** 14
  jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, state.params))
  assert int(state.step) == 1
  # Two finite steps (period 2) double the scale back and do update the params.
  state, _ = step(state, batch)
  state, metrics = step(state, batch)
  assert float(metrics["grads_finite"]) == 1.0
  assert float(state.loss_scale.scale) == 2.0 ** 15
  assert not np.array_equal(before["head"]["kernel"], np.asarray(state.params["head"]["kernel"]))
