"""MLP: the foundation layout, norms, inverted dropout, residuals, init by name."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models
from jaxdl.models.mlp import MLP

X = jax.random.normal(jax.random.key(0), (16, 2))


def test_foundation_layout_and_batchnorm():
  m = models.build_model(ml_collections.ConfigDict(dict(name="mlp", hidden=(64, 64, 64), out=1,
                                                        norm="batch")))
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  assert set(v["params"]) == {"dense_0", "dense_1", "dense_2", "norm_0", "norm_1", "norm_2",
                              "head"}
  y, st = jax.jit(lambda v, x: m.apply(v, x, train=True, mutable=["batch_stats"]))(v, X)
  assert y.shape == (16, 1) and y.dtype == jnp.float32
  # One step of running averages with momentum 0.9 (PyTorch's 0.1) from mean 0.
  h = X @ v["params"]["dense_0"]["kernel"] + v["params"]["dense_0"]["bias"]
  np.testing.assert_allclose(st["batch_stats"]["norm_0"]["mean"], 0.1 * h.mean(0), rtol=1e-4,
                             atol=1e-7)
  ye = m.apply(v, X[:1], train=False)  # eval works with a batch of one
  assert bool(jnp.isfinite(ye).all())


@pytest.mark.parametrize("norm", ["none", "layer", "rms"])
def test_norms_shapes_jit_and_not(norm):
  m = MLP(hidden=(8, 8), out=3, norm=norm)
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  y = m.apply(v, X, train=False)
  np.testing.assert_allclose(jax.jit(lambda v: m.apply(v, X, train=False))(v), y, atol=1e-6)
  assert y.shape == (16, 3) and bool(jnp.isfinite(y).all())


def test_inverted_dropout_keeps_the_mean():
  m = MLP(hidden=(512,), out=1, dropout=0.5, activation="identity", init_name="he")
  x = jnp.ones((1, 4))
  v = jax.jit(lambda: m.init(jax.random.key(1), x, train=False))()
  # Read the hidden layer through the head = identity projection of its mean.
  head = {"kernel": jnp.full((512, 1), 1 / 512), "bias": jnp.zeros((1,))}
  v = {"params": dict(v["params"], head=head)}
  f = jax.jit(jax.vmap(lambda k: m.apply(v, x, train=True, rngs={"dropout": k})[0, 0]))
  train_mean = float(f(jax.random.split(jax.random.key(2), 400)).mean())
  eval_out = float(m.apply(v, x, train=False)[0, 0])
  np.testing.assert_allclose(train_mean, eval_out, rtol=0.02, atol=1e-3)
  a = m.apply(v, x, train=True, rngs={"dropout": jax.random.key(3)})
  assert float(a[0, 0]) != eval_out  # dropout is active in training


def test_residual_and_init_names():
  m = MLP(hidden=(2, 2), out=1, residual=True, activation="identity")
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  p = v["params"]
  h1 = X @ p["dense_0"]["kernel"] + p["dense_0"]["bias"] + X
  h2 = h1 @ p["dense_1"]["kernel"] + p["dense_1"]["bias"] + h1
  np.testing.assert_allclose(m.apply(v, X, train=False),
                             h2 @ p["head"]["kernel"] + p["head"]["bias"], atol=1e-5)
  zm = MLP(hidden=(4,), out=1, init_name="zeros")
  z = jax.jit(lambda: zm.init(jax.random.key(1), X, train=False))()
  assert float(jnp.abs(z["params"]["dense_0"]["kernel"]).max()) == 0.0
  with pytest.raises(ValueError, match="^model.init_name: expected one of .*, got 'orthonormal'"):
    MLP(init_name="orthonormal")
