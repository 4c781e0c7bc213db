"""Vision transformer: patch count, pooling, shapes, non-causal attention."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models
from jaxdl.models import patches

X = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))


def _model(**kw):
  return models.build_model(ml_collections.ConfigDict(dict(name="vit", d_model=16, n_layer=2,
                                                           n_head=2, out=10, **kw)))


@pytest.mark.parametrize("pool,p,tokens", [("cls", 2, 16 + 1), ("mean", 4, 4)])
def test_vit_shapes_and_token_count(pool, p, tokens):
  m = _model(pool=pool, patch_size=p)
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  assert v["params"]["pos_embed"].shape == (1, tokens, 16)  # T = HW / P^2 (+1 class token)
  y = jax.jit(lambda v, x: m.apply(v, x, train=False))(v, X)
  assert y.shape == (2, 10) and y.dtype == jnp.float32 and bool(jnp.isfinite(y).all())


def test_vit_attention_is_not_causal_and_bad_patches():
  m = _model(pool="mean", patch_size=4)
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  # The first patch's features depend on the last patch (bottom-right 4x4 pixels).
  g = jax.jit(jax.grad(lambda x: m.apply(v, x, train=False)[0, 0]))(X)
  assert float(jnp.abs(g[0, 4:, 4:]).sum()) > 0
  with pytest.raises(ValueError, match="not divisible into 3x3 patches"):
    jax.eval_shape(lambda: _model(patch_size=3).init(jax.random.key(1), X, train=False))
  flat = _model(pool="mean", patch_size=4, image_shape=(8, 8, 1))
  both = jax.jit(lambda: (flat.apply(v, X.reshape(2, 64), train=False),
                          m.apply(v, X, train=False)))
  np.testing.assert_allclose(*both(), atol=1e-5)


def test_patch_embedding_is_the_p_by_p_convolution_of_stride_p():
  """`patches.patch_embed` (ViT's and DiT's) is flattened patches times a (P P C, D) kernel:
  the same numbers as a P x P convolution of stride P whose HWIO kernel is that one reshaped."""
  x = jax.random.normal(jax.random.key(2), (2, 8, 8, 3))
  w = jax.random.normal(jax.random.key(3), (4 * 4 * 3, 16))
  b = jax.random.normal(jax.random.key(4), (16,))
  conv = nn.Conv(16, (4, 4), strides=(4, 4), padding="VALID")
  want = conv.apply({"params": {"kernel": w.reshape(4, 4, 3, 16), "bias": b}}, x)
  np.testing.assert_allclose(patches.patchify(x, 4) @ w + b, want.reshape(2, 4, 16),
                             atol=1e-5)
  m = _model(pool="mean", patch_size=4)
  v = jax.eval_shape(lambda: m.init(jax.random.key(1), X, train=False))
  assert v["params"]["patch_embed"]["kernel"].shape == (4 * 4 * 1, 16)
