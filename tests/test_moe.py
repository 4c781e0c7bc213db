"""Mixture of experts: routing by hand, dispatch against every expert on every token, the aux
losses through the lm task, params / FLOPs per token, expert parallelism on 4 emulated devices,
and the bad inputs."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxdl import cli
from jaxdl.models import build_model, gpt_config, moe
from jaxdl.models.costs import gpt_costs
from jaxdl.models.gpt import GPT
from jaxdl.train import step, strategies, tasks
from jaxdl.train.step import create_train_state

TINY = dict(vocab_size=32, block_size=8, n_layer=2, n_head=2, d_model=16)
ONE_LAYER = {**TINY, "n_layer": 1}  # the parallel test compiles three times: keep it small


def test_routing_by_hand_capacity_drops_later_choices():
  # Four tokens, two experts, top-1; every token prefers expert 0, C = ceil(1.0 * 1 * 4 / 2) = 2.
  z = jnp.log(jnp.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]]))
  spec = moe.MoeSpec(experts=2, top_k=1, capacity_factor=1.0)
  assert spec.capacity(4) == 2
  expert, slot, gate, kept, terms = route = moe.route(z, spec, spec.capacity(4))
  del route
  np.testing.assert_array_equal(expert, [[0, 0, 0, 0]])
  np.testing.assert_array_equal(slot, [[0, 1, 2, 3]])
  np.testing.assert_array_equal(kept, [[1, 1, 0, 0]])
  np.testing.assert_allclose(gate, [[0.9, 0.8, 0.7, 0.6]], rtol=1e-6)
  # f = (1, 0), P = (0.75, 0.25): L_bal = 2 (1 * 0.75) = 1.5; logsumexp of log-probs is 0.
  np.testing.assert_allclose(terms["balance"], 1.5, rtol=1e-6)
  np.testing.assert_allclose(terms["z"], 0.0, atol=1e-10)
  np.testing.assert_allclose(terms["dropped"], 0.5)
  np.testing.assert_allclose(terms["load"], [2.0, 0.0])
  # Top-2: first choices fill the slots before any second choice.
  expert, slot, _, kept, _ = moe.route(z, moe.MoeSpec(2, 2, 1.0), 4)
  np.testing.assert_array_equal(expert, [[0, 0, 0, 0], [1, 1, 1, 1]])
  np.testing.assert_array_equal(slot, [[0, 1, 2, 3], [0, 1, 2, 3]])
  assert float(kept.min()) == 1.0


def test_index_dispatch_equals_every_expert_on_every_token():
  # C = N: nothing dropped
  layer = moe.MoeMlp(GPT(d_model=8, n_head=2, mlp_hidden=24, moe_experts=4, moe_top_k=2,
                         moe_capacity=2.0).block_spec)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 8))
  params = jax.jit(layer.init)(jax.random.PRNGKey(1), x)["params"]
  y = jax.jit(layer.apply)({"params": params}, x)
  # Reference: run all E experts densely, weight each by its gate if chosen (else 0).
  x_nd = x.reshape(-1, 8)
  p = jax.nn.softmax(x_nd @ params["router"], axis=-1)
  top = jnp.argsort(-p, axis=-1)[:, :2]
  chosen = jax.nn.one_hot(top, 4).sum(1)
  h = jax.nn.gelu(jnp.einsum("nd,edf->nef", x_nd, params["expert_fc"]), approximate=True)
  out = jnp.einsum("nef,efd->ned", h, params["expert_proj"])
  ref = jnp.einsum("ne,ned->nd", p * chosen, out).reshape(x.shape)
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def lm():
  model = build_model(gpt_config("", moe_experts=4, moe_top_k=2, moe_capacity=1.0, **TINY))
  tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 9), 0, TINY["vocab_size"])
  batch = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
  variables = jax.jit(lambda k: model.init(k, batch["x"], train=False))(jax.random.PRNGKey(1))
  task = tasks.make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  return model, variables["params"], batch, task


def test_aux_losses_join_the_training_loss_only(lm):
  model, params, batch, task = lm
  rngs = {"dropout": jax.random.PRNGKey(2)}
  loss = jax.jit(lambda p, train: task.loss_fn(model.apply, p, {}, batch, rngs, train),
                 static_argnums=1)
  train_loss, (m, state) = loss(params, True)
  eval_loss, (m_eval, _) = loss(params, False)
  assert state == {} and not any(k.startswith("moe_") for k in m_eval)
  # train = CE + sum over 2 layers of (0.01 L_bal + 0.001 L_z); eval = CE = ln 2 bits per byte.
  aux = train_loss - eval_loss
  expected = 2 * (0.01 * m["moe_balance"] + 0.001 * m["moe_z"])
  np.testing.assert_allclose(aux, expected, rtol=1e-4)
  np.testing.assert_allclose(m["bits_per_byte"] * math.log(2), eval_loss, rtol=1e-6)
  assert m["moe_balance"] > 0.5  # E sum f P; 1 when router and choices are uniform
  assert 0.0 < m["moe_dropped"] < 1.0   # capacity factor 1 with top-2 of 4 on 32 tokens
  assert m["moe_load_min"] <= 1.0 <= m["moe_load_max"]
  # The router learns through the gates and the aux losses.
  grads = jax.jit(jax.grad(lambda p: loss(p, True)[0]))(params)
  assert float(jnp.abs(grads["h"]["mlp"]["router"]).max()) > 0


def test_params_grow_with_experts_compute_with_top_k():
  c = {(e, k): gpt_costs(build_model(gpt_config("", moe_experts=e, moe_top_k=k, **TINY)))
       for e, k in ((0, 1), (4, 1), (4, 2), (8, 2))}
  d, f, layers = 16, 64, 2
  expert, router = 2 * d * f, d
  # Params: +4 experts add 4 (2 D F + D) per layer; compute does not change but for the router.
  assert c[8, 2]["params"] - c[4, 2]["params"] == layers * 4 * (expert + router)
  assert c[8, 2]["flops_per_token"] - c[4, 2]["flops_per_token"] == layers * 2 * 4 * router
  # A second choice adds one expert's matmuls: 2 FLOPs per weight of 2 D F, per layer.
  assert c[4, 2]["flops_per_token"] - c[4, 1]["flops_per_token"] == layers * 2 * expert
  assert c[4, 2]["active_params"] - c[4, 1]["active_params"] == layers * expert
  # By hand: wte 32 D, wpe 8 D, ln_f 2 D; per layer two LNs 4 D, attention 4 D^2 + 4 D, router
  # D E, experts 2 E D F.
  per_layer = 4 * d + 4 * d * d + 4 * d + d * 4 + 2 * 4 * d * f
  assert c[4, 2]["params"] == 32 * d + 8 * d + 2 * d + layers * per_layer
  # A run's throughput (MFU) counts the active weights, not every expert's.
  from jaxdl.train import throughput
  moe = build_model(gpt_config("", moe_experts=8, moe_top_k=2, **TINY))
  n_active = c[8, 2]["active_params"] - 8 * d  # wpe is a lookup
  assert throughput._gpt_flops(moe, (3, 8)) == 3 * 8 * (6 * n_active + 12 * layers * d * 8)
  assert c[8, 2]["active_params"] < c[8, 2]["params"]
  # Dense: 2 x (12 D^2 per block + V D head) + 4 T D per layer (biases are not matmuls).
  assert c[0, 1]["flops_per_token"] == 2 * (layers * 12 * d * d + 32 * d) + 4 * 8 * d * layers


def _two_steps(strategy, batches):
  model = build_model(gpt_config("", moe_experts=4, moe_top_k=2, moe_capacity=1.0, **ONE_LAYER))
  tx = optax.sgd(0.5)  # updates linear in the gradients: sharding changes only rounding
  task = tasks.make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  train_step = step.make_train_step(model.apply, task.loss_fn, tx, lambda s: 0.5,
                                    jax.random.PRNGKey(3))
  state = strategy.place_state(create_train_state(model, tx, jax.random.PRNGKey(4),
                                                  batches[0]["x"][:1]))
  compiled = strategy.compile_train(train_step, state)
  losses = []
  for b in batches:
    state, metrics = compiled(state, strategy.shard_batch(b))
    losses.append(float(metrics["loss"]))
  return state, losses


def test_expert_parallel_equals_one_device():
  assert jax.device_count() == 4
  tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(5), (2, 8, 9), 0, 32))
  batches = [{"x": t[:, :-1], "y": t[:, 1:]} for t in tokens]
  ref_state, ref_loss = _two_steps(strategies.make_strategy("jit", 1), batches)
  for name, fsdp, expert in (("jit", 0, 4), ("fsdp", 2, 2)):
    strategy = strategies.make_strategy(name, 0, fsdp=fsdp, expert=expert)
    state, losses = _two_steps(strategy, batches)
    w = state.params["h"]["mlp"]["expert_fc"]  # (L, E, D, F)
    assert w.sharding.spec[1] == "expert" and w.addressable_shards[0].data.shape[1] == 4 // expert
    np.testing.assert_allclose(losses, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 jax.device_get(state.params), jax.device_get(ref_state.params))


@pytest.mark.parametrize("sets,key", [
    (["model.moe_experts=2", "model.moe_top_k=3"], "model.moe_top_k"),
    (["model.moe_experts=2", "model.moe_capacity=0.0"], "model.moe_capacity"),
    (["model.moe_experts=6", "parallel.expert=4"], "parallel.expert"),
    (["model.moe_experts=4", "parallel.expert=3"], "parallel.expert"),
])
def test_bad_moe_config_is_one_line_exit_2(sets, key, tmp_path, capsys):
  argv = ["train", "char_gpt:smoke", "--workdir", str(tmp_path / "w"), "--no-progress"]
  for s in sets:
    argv += ["--set", s]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and key in err[0], err
  assert not (tmp_path / "w").exists()


def test_expert_spec_splits_the_expert_axis():
  from jaxdl.train.sharding_rules import param_spec
  spec = lambda path, shape, f, x: param_spec(path, shape, {"fsdp": f, "expert": x})  # noqa: E731
  assert spec(".params['h']['mlp']['expert_fc']", (2, 4, 16, 64), 2, 2) == P(
      None, "expert", None, "fsdp")
  assert spec(".params['mlp']['expert_proj']", (4, 64, 16), 1, 4) == P("expert", None, None)
  assert spec(".params['h']['mlp']['router']", (2, 16, 4), 2, 2) == P(None, "fsdp", None)
