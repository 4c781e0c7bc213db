"""Gradient accumulation (train.grad_accum): N microbatches equal one batch, under every strategy,
with fp16 loss scaling and with BatchNorm, in both loop forms; a bad N is one line, exit 2,
before anything compiles."""

import jax
import jax.numpy as jnp
import flax.linen as nn
import ml_collections
import numpy as np
import optax
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.models.cnn import CNN
from jaxdl.models.mlp import MLP
from jaxdl.optim import precision
from jaxdl.train import build, create_train_state, make_task, make_train_step
from jaxdl.train.accumulation import accumulate_gradients, compiler_options, split_microbatches
from jaxdl.train.mesh import MeshStrategy
from jaxdl.train.step import step_rngs

STEPS = 3
BATCH = 64  # 16 rows per device on 4 devices: N = 4 gives 4-row microbatches on every device


def _train(strategy: str, grad_accum: int):
  """STEPS steps of a small moons MLP (AdamW) on the first STEPS batches of the stream."""
  config, _ = load_config("moons_mlp:plain", [
      f"parallel.strategy='{strategy}'", f"data.batch_size={BATCH}", f"train.steps={STEPS}",
      f"train.grad_accum={grad_accum}", "model.hidden=(16,16)", "optim.name='adamw'",
      "optim.weight_decay=0.01"])
  r = build(config)
  state = r.strategy.place_state(r.init_state(r.strategy.state_shardings(r.abstract_state())))
  step = make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key,
                         axis_name=r.strategy.axis_name, grad_accum=r.train.grad_accum)
  train_fn = r.strategy.compile_train(step, state, compiler_options(r.train.grad_accum))
  it, metrics = r.ds.train_iter(), []
  for _ in range(STEPS):
    state, m = train_fn(state, r.strategy.shard_batch(next(it)))
    metrics.append(jax.device_get(r.strategy.first(m)))
  return metrics, jax.device_get(r.strategy.single_copy(state).params)


@pytest.fixture(scope="module")
def one_batch():
  """The reference: N = 1 under jit on the 4 devices."""
  assert jax.device_count() == 4
  return _train("jit", 1)


@pytest.mark.parametrize("strategy", ["jit", "fsdp", "pmap"])
def test_four_microbatches_equal_one_batch(strategy, one_batch):
  (m1, params1), (m4, params4) = one_batch, _train(strategy, 4)
  for a, b in zip(m1, m4):
    for key in ("loss", "accuracy", "grad_norm"):  # metrics: the mean over the microbatches
      np.testing.assert_allclose(b[key], a[key], rtol=1e-6, err_msg=key)
  assert m1[-1]["loss"] < m1[0]["loss"]  # the steps really train
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7),
               params1, params4)


def _mlp_setup(norm: str, policy: str = "fp32"):
  model = MLP(hidden=(16,), out=3, norm=norm, dtype=precision.get_policy(policy).compute_dtype)
  task = make_task(ml_collections.ConfigDict(dict(task="classification", train={})))
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(16, 2)).astype(np.float32),
           "y": rng.integers(0, 3, size=16).astype(np.int32)}
  return model, task, batch


def _step(model, task, tx, n, **kw):
  return jax.jit(make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.1),
                                 jax.random.PRNGKey(1), grad_accum=n), **kw)


def test_batchnorm_statistics_are_per_microbatch():
  """N = 4 with BatchNorm equals SGD on the mean of the 4 microbatch gradients, each taken with
  that microbatch's own statistics, the running averages updated once per microbatch in turn."""
  model, task, batch = _mlp_setup("batch")
  tx = optax.sgd(0.1)
  state = create_train_state(model, tx, jax.random.PRNGKey(0), batch["x"])
  new_state, metrics = _step(model, task, tx, 4)(state, batch)

  def micro_loss(params, stats, micro):
    logits, updates = model.apply({"params": params, "batch_stats": stats}, micro["x"],
                                  train=True, mutable=["batch_stats"])
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, micro["y"]).mean()
    return nll, updates["batch_stats"]

  grad_fn = jax.jit(jax.value_and_grad(micro_loss, has_aux=True))
  stats, grads, losses = state.model_state["batch_stats"], [], []
  for i in range(4):
    micro = {k: v[i::4] for k, v in batch.items()}  # rows i, i + 4, ... (the strided split)
    (loss, stats), g = grad_fn(state.params, stats, micro)
    grads.append(g)
    losses.append(loss)
  mean_g = jax.tree.map(lambda *g: sum(g) / 4, *grads)
  expected = jax.tree.map(lambda p, g: p - 0.1 * g, state.params, mean_g)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree.map(close, new_state.params, expected)
  jax.tree.map(close, new_state.model_state["batch_stats"], stats)
  close(metrics["loss"], np.mean(losses))
  # And the split itself: microbatch i is rows i, i + N, ...
  np.testing.assert_array_equal(split_microbatches(batch, 4)["x"][1], batch["x"][1::4])


def test_fp16_loss_scaling_with_accumulation():
  """fp16 at N = 4 follows N = 1 (to fp16 compute precision), and an overflowing scale skips
  the step (params kept, S halved) exactly as without accumulation."""
  model, task, batch = _mlp_setup("none", "fp16")
  tx = optax.sgd(0.1)
  scale = precision.DynamicLossScale.create(2.0**10)
  state = create_train_state(model, tx, jax.random.PRNGKey(0), batch["x"], loss_scale=scale)
  step4 = _step(model, task, tx, 4)
  (s1, m1), (s4, m4) = _step(model, task, tx, 1)(state, batch), step4(state, batch)
  assert float(m1["grads_finite"]) == float(m4["grads_finite"]) == 1.0
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=2e-3)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=2e-3, atol=1e-4),
               s1.params, s4.params)
  huge = state.replace(loss_scale=precision.DynamicLossScale.create(2.0**100))  # S = inf-ish
  skipped, m = step4(huge, batch)
  assert float(m["grads_finite"]) == 0.0
  jax.tree.map(np.testing.assert_array_equal, skipped.params, state.params)
  assert float(skipped.loss_scale.scale) == float(jnp.float32(2.0**99))


@pytest.mark.parametrize("value,expected", [
    (3, "train.grad_accum: 3 does not divide the per-device batch 250"),
    (0, "train.grad_accum: must be >= 1, got 0")])
def test_bad_grad_accum_is_one_line_exit_2(value, expected, tmp_path, capsys):
  workdir = tmp_path / "run"
  argv = ["train", "moons_mlp:smoke", "--set", f"train.grad_accum={value}", "--workdir",
          str(workdir), "--no-progress"]
  capsys.readouterr()
  assert cli.main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and expected in lines[0], lines
  assert not workdir.exists()


def _small_cnn(rows: int):
  model = CNN(features=(4, 8), hidden=16, out=3, norm="batch", dropout=0.5)
  task = make_task(ml_collections.ConfigDict(dict(task="classification", train={})))
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(rows, 8, 8, 1)).astype(np.float32),
           "y": rng.integers(0, 3, size=rows).astype(np.int32)}
  state = create_train_state(model, optax.sgd(0.1), jax.random.PRNGKey(0), batch["x"])
  return model, task, batch, state


def test_microbatch_loop_forms_agree():
  """The loop forms of `accumulate_gradients` are programs for one sum: a `lax.scan` and a
  Python loop of N microbatch gradients. With dropout and BatchNorm, so keys and running
  statistics follow the same microbatches."""
  model, task, batch, state = _small_cnn(8)
  rngs = step_rngs(jax.random.PRNGKey(1), jnp.zeros((), jnp.int32))
  grad_fn = _grad_fn(model, task)
  run = lambda loop: jax.jit(lambda s, b: accumulate_gradients(  # noqa: E731
      grad_fn, s.params, s.model_state, b, rngs, 2, loop=loop))(state, batch)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # noqa: E731
  jax.tree.map(close, run("scan"), run("unroll"))


def test_the_xla_cpu_seam_rewrites_only_the_loop_and_keeps_the_step():
  """`xla_cpu.train_program` (the loop's one call site) gives the step at N = 2 with its scan
  body's convolutions in XLA:CPU's canonical layout: the same update; switched off, or at
  N = 1, it is the step itself."""
  from jaxdl.train import xla_cpu
  model, task, batch, state = _small_cnn(8)
  step = make_train_step(model.apply, task.loss_fn, optax.sgd(0.1), optax.constant_schedule(0.1),
                         jax.random.PRNGKey(1), grad_accum=2)
  assert xla_cpu.train_program(step, False, 2) is step
  assert xla_cpu.train_program(step, True, 1) is step
  rewritten = xla_cpu.train_program(step, True, 2)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # noqa: E731
  jax.tree.map(close, jax.jit(rewritten)(state, batch), jax.jit(step)(state, batch))
  scan = [e for e in jax.make_jaxpr(rewritten)(state, batch).jaxpr.eqns
          if e.primitive.name == "scan"]
  convs = [e for e in scan[0].params["jaxpr"].jaxpr.eqns if e.primitive.name ==
           "conv_general_dilated"]
  assert len(scan) == 1 and convs
  for e in convs:
    assert tuple(e.params["dimension_numbers"]) == ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def test_canonical_convolutions_keep_every_layout():
  """`canonical_convolutions` is the same function for convolutions in any layout (NCHW input,
  OIHW kernel, a transposed output, strides, dilation, feature groups), and the program it makes
  holds only convolutions in the canonical (B, S.., F) x (S.., I, O) layout."""
  from jaxdl.train.xla_cpu import canonical_convolutions
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 4, 9, 7)), jnp.float32)  # N C H W
  k = jnp.asarray(rng.normal(size=(6, 2, 3, 2)), jnp.float32)  # O I/groups H W

  def f(x, k):
    y = jax.lax.conv_general_dilated(x, k, (2, 1), "SAME", rhs_dilation=(1, 2),
                                     dimension_numbers=("NCHW", "OIHW", "HWNC"),
                                     feature_group_count=2)
    return jax.grad(lambda x, k: jnp.sum(jnp.sin(jax.lax.conv_general_dilated(
        x, k, (2, 1), "SAME", rhs_dilation=(1, 2), dimension_numbers=("NCHW", "OIHW", "HWNC"),
        feature_group_count=2))), argnums=(0, 1))(x, k), y

  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # noqa: E731
  jax.tree.map(close, jax.jit(canonical_convolutions(f))(x, k), jax.jit(f)(x, k))
  jaxpr = jax.make_jaxpr(canonical_convolutions(f))(x, k).jaxpr
  convs = [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
  assert len(convs) == 4  # y, and the forward, input- and weight-gradient ones of the grad
  for e in convs:
    assert tuple(e.params["dimension_numbers"]) == ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def test_accumulation_keeps_one_microbatch_alive():
  """The compiled step at N = 4 on 4 M rows needs at most 1.3x the temporary memory of one step
  on M rows (XLA's buffer assignment, deterministic for a given jax): the loop holds one
  microbatch's activations, not N. A small CNN with max pooling, whose unrolled form holds N
  copies of the pooling gradient's index buffers."""
  model, task, batch, state = _small_cnn(4 * 32)
  tx = optax.adamw(1e-3)
  state = create_train_state(model, tx, jax.random.PRNGKey(0), batch["x"])

  def temp_bytes(n, rows):
    step = _step(model, task, tx, n, donate_argnums=0)
    b = {k: v[:rows] for k, v in batch.items()}
    return step.lower(state, b).compile().memory_analysis().temp_size_in_bytes

  one, four = temp_bytes(1, 32), temp_bytes(4, 4 * 32)
  assert four <= 1.3 * one, (four, one)


@pytest.mark.parametrize("compile_with", ["make_train_step", "jit_strategy"])
def test_dropout_counters_are_not_carried_through_the_loop(compile_with):
  """The same 1.3x bound for an MLP with BatchNorm and dropout, compiled as the trainer compiles
  it (`make_train_step(jit=True)`, or `Strategy.compile_train` with
  `accumulation.compiler_options`): with XLA's loop-invariant code motion on, each dropout
  mask's random-number counters (iotas, which depend on nothing) were hoisted out of the loop
  and carried through all N microbatches, 1.41x here (1.57x for the digits MLP)."""
  model = MLP(hidden=(64, 64), out=10, norm="batch", dropout=0.1)
  task = make_task(ml_collections.ConfigDict(dict(task="classification", train={})))
  rng = np.random.default_rng(0)
  batch = {"x": rng.normal(size=(4 * 128, 64)).astype(np.float32),
           "y": rng.integers(0, 10, size=4 * 128).astype(np.int32)}
  tx = optax.adamw(1e-3)
  state = create_train_state(model, tx, jax.random.PRNGKey(0), batch["x"][:128])

  def temp_bytes(n):
    jitted = compile_with == "make_train_step"
    step = make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.1),
                           jax.random.PRNGKey(1), grad_accum=n, jit=jitted)
    if not jitted:
      step = MeshStrategy("jit", jax.devices()[:1]).compile_train(step, state, compiler_options(n))
    b = {k: v[:128 * n] for k, v in batch.items()}
    return step.lower(state, b).compile().memory_analysis().temp_size_in_bytes

  one, four = temp_bytes(1), temp_bytes(4)
  assert four <= 1.3 * one, (four, one)


def _grad_fn(model, task):
  def grad_fn(params, model_state, micro, rngs):
    def objective(params):
      loss, (metrics, new_state) = task.loss_fn(model.apply, params, model_state, micro, rngs,
                                                True)
      return loss, (loss, metrics, new_state)
    return jax.grad(objective, has_aux=True)(params)

  return grad_fn


class _TinyLM(nn.Module):
  """Token embedding and a linear head: logits (B, T, 8) for the masked-loss tests."""

  @nn.compact
  def __call__(self, x, train=False):
    del train
    return nn.Dense(8)(nn.Embed(8, 8)(x))


def _masked_lm():
  """A tiny LM, its task, and a batch whose scored tokens (loss_mask) are uneven both ways:
  microbatch 0 of N = 4 (rows 0, 4, 8, 12) and device 0 of 4 (rows 0-3) score one token a row,
  most other rows all six."""
  rng = np.random.default_rng(0)
  mask = np.ones((16, 6), np.float32)
  mask[[0, 4, 8, 12, 1, 2, 3], 1:] = 0
  batch = {"x": rng.integers(0, 8, (16, 6)).astype(np.int32),
           "y": rng.integers(0, 8, (16, 6)).astype(np.int32), "loss_mask": mask}
  task = make_task(ml_collections.ConfigDict(dict(task="lm", train={})))
  model, tx = _TinyLM(), optax.sgd(0.5)
  return model, task, tx, batch, create_train_state(model, tx, jax.random.PRNGKey(0), batch["x"])


def _close(a, b, keys=("loss", "accuracy", "grad_norm")):
  for key in keys:
    np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_a_masked_loss_accumulates_to_the_whole_batch():
  """Each microbatch's loss divides by its own scored tokens; weighted by them
  (`Task.loss_weight`), N = 4 is the whole batch's loss, metrics and update. Unweighted (the
  mean of the microbatch means) it is not: microbatch 0's four tokens would count as much as
  another's 23."""
  model, task, tx, batch, state = _masked_lm()

  def step(n, weight):
    return jax.jit(make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.5),
                                   jax.random.PRNGKey(1), grad_accum=n,
                                   loss_weight=task.loss_weight if weight else None))(state, batch)

  (s1, m1), (s4, m4) = step(1, True), step(4, True)
  _close(m1, m4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               s1.params, s4.params)
  assert abs(float(step(4, False)[1]["loss"]) - float(m1["loss"])) > 1e-2


def test_pmap_weighs_each_device_by_what_it_scores():
  """Under pmap each device's loss divides by its own scored tokens; `weighted_pmean` makes the
  update the whole batch's, as jit on one device computes it (device 0 scores 4 tokens, the
  others 19-24)."""
  model, task, tx, batch, state = _masked_lm()

  def step(axis_name, weight):
    return make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(0.5),
                           jax.random.PRNGKey(1), axis_name=axis_name,
                           loss_weight=task.loss_weight if weight else None)

  s1, m1 = jax.jit(step(None, True))(state, batch)
  devices = jax.devices()[:4]
  per_device = {k: v.reshape(4, 4, *v.shape[1:]) for k, v in batch.items()}
  replicated = jax.tree.map(lambda x: np.stack([np.asarray(x)] * 4), state)
  s4, m4 = jax.pmap(step("d", True), axis_name="d", devices=devices)(replicated, per_device)
  _close(m1, jax.tree.map(lambda v: v[0], m4))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b[0], rtol=1e-6, atol=1e-7),
               s1.params, s4.params)
  _, plain = jax.pmap(step("d", False), axis_name="d", devices=devices)(replicated, per_device)
  assert abs(float(plain["loss"][0]) - float(m1["loss"])) > 1e-2
