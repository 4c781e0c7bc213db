"""jaxdl.optim.precision: policies, dynamic loss scaling, skipping non-finite steps."""

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.optim import default_optim_config, make_optimizer
from jaxdl.optim.precision import (DynamicLossScale, NoOpLossScale, all_finite, get_policy,
                                   make_loss_scale, select_tree)


def test_policies():
  p = get_policy("bf16")
  assert (p.compute_dtype, p.param_dtype, p.output_dtype, p.loss_scaling) == (
      jnp.bfloat16, jnp.float32, jnp.float32, False)
  assert get_policy("fp16").compute_dtype == jnp.float16 and get_policy("fp16").loss_scaling
  assert get_policy("fp32").compute_dtype == jnp.float32
  batch = p.cast_to_compute({"x": jnp.ones((2,)), "y": jnp.ones((2,), jnp.int32)})
  assert batch["x"].dtype == jnp.bfloat16 and batch["y"].dtype == jnp.int32
  assert isinstance(make_loss_scale("bf16"), NoOpLossScale)
  assert isinstance(make_loss_scale("fp16"), DynamicLossScale)
  with pytest.raises(ValueError, match=r"^train\.precision: unknown policy 'fp8'.*'fp16'"):
    get_policy("fp8")


def _sgd():
  c = default_optim_config()
  c.name, c.lr, c.momentum, c.clip_norm, c.weight_decay = "momentum", 0.1, 0.9, None, 0.0
  c.schedule.name, c.schedule.warmup_frac = "constant", 0.0
  tx, _ = make_optimizer(c, 100)
  return tx


@jax.jit
def _step(params, opt_state, ls, x):
  """One fp16 train step as the engine would write it."""
  tx = _sgd()

  def scaled(p):
    loss = jnp.sum((p["w"].astype(jnp.float16) * x.astype(jnp.float16)).astype(jnp.float32))
    return ls.scale_loss(loss)

  grads = ls.unscale(jax.grad(scaled)(params))
  finite = all_finite(grads)
  updates, new_opt = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  params, opt_state = select_tree(finite, (new_params, new_opt), (params, opt_state))
  return params, opt_state, ls.adjust(finite), finite


def test_overflow_skips_step_and_halves_scale_then_regrows():
  tx = _sgd()
  params = {"w": jnp.ones((3,))}
  opt = tx.init(params)
  ls = DynamicLossScale.create(init_scale=2.0**10, period=3)
  x_ok = jnp.array([1.0, 2.0, 3.0])
  params, opt, ls, fin = _step(params, opt, ls, x_ok)
  assert bool(fin) and int(ls.counter) == 1 and float(ls.scale) == 2.0**10
  np.testing.assert_allclose(params["w"], 1.0 - 0.1 * np.array([1.0, 2.0, 3.0]))
  before = (params, opt)
  # Scaled by S the fp16 product overflows (65504 is fp16's max): non-finite grads.
  params, opt, ls, fin = _step(params, opt, ls, jnp.array([1.0, 100.0, 1.0]))
  assert not bool(fin)
  assert float(ls.scale) == 2.0**9 and int(ls.counter) == 0          # halved, counter reset
  jax.tree.map(np.testing.assert_array_equal, (params, opt), before)  # step skipped
  for k in range(3):                                                 # N = 3 finite steps
    assert float(ls.scale) == 2.0**9
    params, opt, ls, fin = _step(params, opt, ls, x_ok)
    assert bool(fin)
  assert float(ls.scale) == 2.0**10 and int(ls.counter) == 0         # doubled after N


def test_scale_has_a_floor_a_ceiling_and_counts_are_arrays():
  ls = DynamicLossScale.create(init_scale=2.0, period=5, min_scale=1.0)
  for _ in range(3):
    ls = ls.adjust(jnp.asarray(False))
  assert float(ls.scale) == 1.0
  ls = DynamicLossScale.create(init_scale=2.0**23, period=1, max_scale=2.0**24)
  for _ in range(3):
    ls = ls.adjust(jnp.asarray(True))
  assert float(ls.scale) == 2.0**24
  assert ls.scale.dtype == jnp.float32 and ls.counter.dtype == jnp.int32


def test_loss_scaling_rescues_fp16_gradient_underflow():
  """d(1e-4 * w * x)/dw = 1e-4 x is below fp16's smallest subnormal for x = 1e-5 (1e-9 < 6e-8):
  unscaled it flushes to 0; scaled by S = 2^15 it survives and unscales to the right value."""
  w, x = jnp.asarray(1.0, jnp.float16), jnp.asarray(1e-5, jnp.float16)
  f = lambda w, s: (w * x * jnp.asarray(1e-4, jnp.float16)) * jnp.asarray(s, jnp.float16)
  assert float(jax.grad(f)(w, 1.0)) == 0.0
  ls = DynamicLossScale.create(2.0**15)
  g = ls.unscale(jax.grad(f)(w, 2.0**15))
  assert g.dtype == jnp.float32
  assert float(g) == pytest.approx(1e-9, rel=0.05)


def test_loss_scale_round_trips_through_a_state_dict():
  ls = DynamicLossScale.create(2.0**12, period=7).adjust(True)
  restored = flax.serialization.from_state_dict(DynamicLossScale.create(1.0, period=7),
                                                flax.serialization.to_state_dict(ls))
  assert float(restored.scale) == 2.0**12 and int(restored.counter) == 1
  assert restored.period == 7
  assert len(jax.tree.leaves(ls)) == 2  # S and c are the only pytree leaves


@pytest.fixture(scope="module")
def moons():
  from sklearn.datasets import make_moons
  x, y = make_moons(n_samples=500, noise=0.15, random_state=0)
  return (jnp.asarray(x[:300], jnp.float32), jnp.asarray(y[:300], jnp.float32),
          jnp.asarray(x[300:], jnp.float32), jnp.asarray(y[300:]))


def _train_moons(moons, precision, steps=200):
  from jaxdl.models.mlp import MLP
  policy = get_policy(precision)
  xtr, ytr, xte, yte = moons
  model = MLP(hidden=(32, 32), out=1, dtype=policy.compute_dtype)
  params = model.init(jax.random.PRNGKey(0), xtr[:2], train=False)["params"]
  c = default_optim_config()
  c.lr, c.schedule.name = 1e-2, "constant"
  tx, _ = make_optimizer(c, steps)
  ls = make_loss_scale(policy, init_scale=2.0**8, period=50)

  def step(_, carry):
    params, opt, ls = carry
    def loss_fn(p):
      logits = model.apply({"params": p}, policy.cast_to_compute(xtr), train=True)[:, 0]
      loss = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), ytr).mean()
      return ls.scale_loss(loss)

    grads = ls.unscale(jax.grad(loss_fn)(params))
    finite = all_finite(grads)
    updates, new_opt = tx.update(grads, opt, params)
    new = optax.apply_updates(params, updates)
    params, opt = select_tree(finite, (new, new_opt), (params, opt))
    return params, opt, ls.adjust(finite)

  # the whole run is one compiled loop: 300 dispatches would dominate the test's time
  train = jax.jit(lambda c: jax.lax.fori_loop(0, steps, step, c))
  params, _, ls = train((params, tx.init(params), ls))
  assert jax.tree.leaves(params)[0].dtype == jnp.float32  # master weights stay fp32
  logits = model.apply({"params": params}, policy.cast_to_compute(xte), train=False)[:, 0]
  return float(jnp.mean((logits > 0) == (yte > 0.5)))


@pytest.mark.slow
def test_bf16_and_fp16_match_fp32_accuracy_on_moons(moons):
  acc = {p: _train_moons(moons, p) for p in ("fp32", "bf16", "fp16")}
  print(acc)
  assert acc["fp32"] > 0.95, acc
  assert abs(acc["bf16"] - acc["fp32"]) <= 0.01, acc
  assert abs(acc["fp16"] - acc["fp32"]) <= 0.01, acc
