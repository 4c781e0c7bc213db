"""CNN, ResNet and the conv size helpers."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models


@pytest.mark.parametrize("n,k,s,p,want", [(32, 3, 1, 1, 32), (32, 5, 2, 0, 14), (224, 7, 2, 3, 112),
                                          (8, 2, 2, 0, 4)])
def test_conv_output_size(n, k, s, p, want):
  assert models.conv_output_size(n, k, s, p) == want
  conv = nn.Conv(1, (k, k), strides=(s, s), padding=((p, p), (p, p)))
  x = jnp.zeros((1, n, n, 1))
  y = jax.eval_shape(lambda: conv.init_with_output(jax.random.key(0), x)[0])
  assert y.shape[1] == want


def test_receptive_field_by_gradient():
  assert models.receptive_field(3, 3) == 7 and models.receptive_field(2, 5) == 9
  # Three stacked 3x3 convs: the centre output depends on a 7x7 patch of the input.
  stack = nn.Sequential([nn.Conv(1, (3, 3), padding="SAME") for _ in range(3)])
  x = jnp.ones((1, 15, 15, 1))
  v = jax.jit(lambda: stack.init(jax.random.key(0), x))()
  g = jax.jit(jax.grad(lambda x: stack.apply(v, x)[0, 7, 7, 0]))(x)[0, :, :, 0]
  rows = np.nonzero(np.abs(np.asarray(g)).sum(1))[0]
  assert len(rows) == models.receptive_field(3, 3)


@pytest.mark.parametrize("kind,reference", [("max", nn.max_pool), ("avg", nn.avg_pool)])
def test_block_pool_equals_the_strided_window_and_its_gradient(kind, reference):
  """The CNN's pooling, a reshape and a reduction, against flax's sliding window with window =
  stride (odd sizes drop the last row and column, as 'VALID' does). After a ReLU, the max's
  gradient equals select-and-scatter's too: an all-zero window's tie is zeroed by the ReLU."""
  pool = models.cnn.block_pool
  for shape in ((3, 8, 8, 5), (2, 7, 9, 4)):
    x = jax.random.normal(jax.random.key(1), shape)
    ours = lambda x: pool(jax.nn.relu(x), 2, kind)  # noqa: E731
    theirs = lambda x: reference(jax.nn.relu(x), (2, 2), strides=(2, 2))  # noqa: E731
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-6)
    weights = jax.random.normal(jax.random.key(2), theirs(x).shape)
    grads = [jax.grad(lambda x, f=f: (f(x) * weights).sum())(x) for f in (ours, theirs)]
    np.testing.assert_allclose(*grads, rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="at least that large; got 1 x 4"):
    pool(jnp.zeros((1, 1, 4, 1)), 2, kind)


def _cfg(**kw):
  return ml_collections.ConfigDict(kw)


def test_cnn_shapes_flat_and_batchnorm():
  x = jax.random.normal(jax.random.key(0), (4, 8, 8))
  m = models.build_model(_cfg(name="cnn", features=(8, 16), hidden=32, out=10))
  v = jax.jit(lambda: m.init(jax.random.key(1), x, train=False))()
  y = m.apply(v, x, train=False)
  yj = jax.jit(lambda v, x: m.apply(v, x, train=False))(v, x)
  assert y.shape == (4, 10) and y.dtype == jnp.float32 and bool(jnp.isfinite(y).all())
  np.testing.assert_allclose(y, yj, atol=1e-5)
  flat = models.build_model(_cfg(name="cnn", features=(8, 16), hidden=32, out=10,
                                 image_shape=(8, 8, 1)))
  np.testing.assert_allclose(jax.jit(lambda: flat.apply(v, x.reshape(4, 64), train=False))(), y,
                             atol=1e-6)
  with pytest.raises(ValueError, match="needs image_shape"):
    jax.eval_shape(lambda: m.init(jax.random.key(1), x.reshape(4, 64), train=False))
  bn = models.build_model(_cfg(name="cnn", features=(8,), hidden=0, out=3, norm="batch"))
  vb = jax.jit(lambda: bn.init(jax.random.key(1), x, train=False))()
  _, st = jax.jit(lambda: bn.apply(vb, x, train=True, mutable=["batch_stats"]))()
  assert float(jnp.abs(st["batch_stats"]["norm_0"]["mean"]).max()) > 0


def test_resnet_train_and_eval():
  x = jax.random.normal(jax.random.key(0), (4, 8, 8, 1))
  m = models.build_model(_cfg(name="resnet", stage_sizes=(1, 1), features=(8, 16), out=10))
  v = jax.jit(lambda: m.init(jax.random.key(1), x, train=False))()
  assert v["params"]["stage1_block0"]["proj"]["kernel"].shape == (1, 1, 8, 16)
  f = jax.jit(lambda v, x: m.apply(v, x, train=True, mutable=["batch_stats"]))
  y, st = f(v, x)
  assert y.shape == (4, 10) and bool(jnp.isfinite(y).all())
  ye = jax.jit(lambda v, x: m.apply(v, x, train=False))({**v, **st}, x)
  assert ye.shape == (4, 10) and bool(jnp.isfinite(ye).all())
