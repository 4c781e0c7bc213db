"""Initializers and norms (jaxdl.models.layers) and attention (jaxdl.models.attention)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.models import attention, layers, rope

Q = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], np.float32)
K = np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 1, 0]], np.float32)
V = np.array([[1, 0], [0, 1], [0.5, 0.5]], np.float32)


def _one_head(a):  # (T, K) -> (1, T, 1, K)
  return jnp.asarray(a)[None, :, None, :]


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_worked_attention_example(impl):
  # The course's example: weights and outputs to 2 decimals.
  out, w = attention.dot_product_attention(_one_head(Q), _one_head(K), _one_head(V), impl=impl,
                                        return_weights=True)
  np.testing.assert_allclose(np.asarray(w[0, 0]), [[0.27, 0.27, 0.45], [0.38, 0.38, 0.23],
                                                   [0.51, 0.19, 0.31]], atol=0.006)
  np.testing.assert_allclose(np.asarray(out[0, :, 0]), [[0.50, 0.50], [0.50, 0.50],
                                                        [0.66, 0.34]], atol=0.006)
  # The same numbers from the formula written out with numpy.
  s = Q @ K.T / 2.0
  e = np.exp(s - s.max(1, keepdims=True))
  np.testing.assert_allclose(np.asarray(w[0, 0]), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_fast_path_matches_reference_with_masks():
  ks = jax.random.split(jax.random.key(0), 4)
  q, k, v = (jax.random.normal(kk, (2, 5, 3, 8)) for kk in ks[:3])
  ref, w = attention.dot_product_attention(q, k, v, causal=True, impl="reference",
                                        return_weights=True)
  fast = jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v, causal=True,
                                                              impl="xla"))(q, k, v)
  np.testing.assert_allclose(fast, ref, atol=1e-5)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)  # rows sum to 1
  assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0  # nothing from the future
  chunked = jax.jit(lambda q, k, v: attention.attention_causal_chunked(q, k, v, num_chunks=3))
  np.testing.assert_allclose(chunked(q, k, v), ref, atol=1e-5)  # 5 rows in chunks of 2, 1, 2
  mask = jax.random.bernoulli(ks[3], 0.7, (2, 1, 5, 5)) | jnp.eye(5, dtype=bool)
  ref = attention.dot_product_attention(q, k, v, mask, impl="reference")
  fast = attention.dot_product_attention(q, k, v, mask, impl="xla")
  np.testing.assert_allclose(fast, ref, atol=1e-5)


def test_chunked_attention_gradients_match_reference():
  # The chunked path normalizes after P V with the row max held constant; its gradients must
  # still be those of softmax(Q K^T / sqrt(K)) V.
  ks = jax.random.split(jax.random.key(3), 4)
  q, k, v = (jax.random.normal(kk, (2, 7, 2, 4)) for kk in ks[:3])
  ct = jax.random.normal(ks[3], (2, 7, 2, 4))

  def grads(f):
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2)))(q, k, v)

  ref = grads(lambda q, k, v: attention.attention_reference(q, k, v, causal=True)[0])
  got = grads(lambda q, k, v: attention.attention_causal_chunked(q, k, v, num_chunks=3))
  for g, r in zip(got, ref):
    np.testing.assert_allclose(g, r, atol=1e-5)


def test_layer_norm_value_and_gradients_written_out():
  # y = gamma (x - mu) / sqrt(var + eps) + beta: make_norm('layer') and its gradients against
  # autodiff of the formula written out in jnp.
  ks = jax.random.split(jax.random.key(4), 4)
  x = jax.random.normal(ks[0], (3, 5, 16)) * 2.0 + 1.0
  gamma, beta = jax.random.normal(ks[1], (16,)), jax.random.normal(ks[2], (16,))
  ct = jax.random.normal(ks[3], x.shape)
  norm = layers.make_norm("layer", train=True)

  def ours(x, g, b):
    return norm.apply({"params": {"scale": g, "bias": b}}, x)

  def formula(x, g, b):
    mu = x.mean(-1, keepdims=True)
    return g * (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) + b

  np.testing.assert_allclose(ours(x, gamma, beta), formula(x, gamma, beta), atol=1e-5)
  got = jax.grad(lambda *a: jnp.sum(ours(*a) * ct), argnums=(0, 1, 2))(x, gamma, beta)
  want = jax.grad(lambda *a: jnp.sum(formula(*a) * ct), argnums=(0, 1, 2))(x, gamma, beta)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=1e-4)


def test_causal_mask_offset():
  m = np.asarray(attention.causal_mask(2, 5, offset=2))
  np.testing.assert_array_equal(m, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


def test_multihead_self_and_cross_attention():
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  ctx = jax.random.normal(jax.random.key(2), (2, 4, 16))
  mha = attention.MultiHeadAttention(n_head=4, n_kv_head=4, causal=True, qk_norm=True,
                                     rope=True)
  v = jax.jit(lambda: mha.init(jax.random.key(3), x, train=False))()
  assert set(v["params"]) == {"c_attn", "c_proj", "q_norm", "k_norm"}
  y, aux = jax.jit(lambda v, x: mha.apply(v, x, train=False, return_weights=True))(v, x)
  assert y.shape == (2, 6, 16) and aux["weights"].shape == (2, 4, 6, 6)
  np.testing.assert_allclose(aux["weights"].sum(-1), 1.0, atol=1e-6)
  cross = attention.MultiHeadAttention(n_head=4, n_kv_head=4)
  vc = jax.jit(lambda: cross.init(jax.random.key(4), x, ctx, train=False))()
  yc, aux = cross.apply(vc, x, ctx, train=False, return_weights=True)
  assert yc.shape == (2, 6, 16) and aux["weights"].shape == (2, 4, 6, 4)
  assert bool(jnp.isfinite(yc).all())
  with pytest.raises(ValueError, match="not divisible by n_head"):
    bad = attention.MultiHeadAttention(n_head=5, n_kv_head=5)
    jax.eval_shape(lambda: bad.init(jax.random.key(0), x, train=False))


def test_rope_depends_on_relative_position_only():
  q = jax.random.normal(jax.random.key(0), (1, 1, 1, 8))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, 8))
  dot = lambda m, n: float(jnp.sum(rope.apply_rope(q, jnp.array([m]))  # noqa: E731
                                   * rope.apply_rope(k, jnp.array([n]))))
  np.testing.assert_allclose(dot(3, 1), dot(10, 8), rtol=1e-5)
  np.testing.assert_allclose(dot(0, 0), float(jnp.sum(q * k)), rtol=1e-5)


@pytest.mark.parametrize("name,var", [("xavier_normal", 2 / (400 + 200)),
                                      ("xavier_uniform", 2 / (400 + 200)),
                                      ("he", 2 / 400), ("lecun", 1 / 400)])
def test_initializer_variances(name, var):
  w = layers.get_initializer(name)(jax.random.key(0), (400, 200))
  np.testing.assert_allclose(float(jnp.var(w)), var, rtol=0.03)


def test_gpt2_and_zeros_init_and_bad_names():
  w = layers.get_initializer("gpt2")(jax.random.key(0), (400, 200))
  np.testing.assert_allclose(float(jnp.std(w)), 0.02, rtol=0.02)
  w = layers.residual_out_init("gpt2", 16)(jax.random.key(0), (400, 200))
  np.testing.assert_allclose(float(jnp.std(w)), 0.02 / 4, rtol=0.02)
  assert float(jnp.abs(layers.get_initializer("zeros")(jax.random.key(0), (3, 3))).max()) == 0
  with pytest.raises(ValueError, match="expected one of.*he_normal"):
    layers.get_initializer("kaiming_magic")
  with pytest.raises(ValueError, match="expected one of.*rms"):
    layers.make_norm("weight", train=True)


class _Norm(nn.Module):
  kind: str
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train):
    return layers.make_norm(self.kind, train=train, name="norm", axis_name=self.bn_axis_name)(x)


def test_rmsnorm_formula():
  x = jax.random.normal(jax.random.key(0), (3, 7)) * 3 + 1
  m = _Norm("rms")
  v = jax.jit(lambda: m.init(jax.random.key(1), x, train=False))()
  assert set(v["params"]["norm"]) == {"scale"}  # no beta
  expected = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(m.apply(v, x, train=False), expected, rtol=1e-5)


def test_batchnorm_train_vs_eval_and_batch_of_one():
  x = jax.random.normal(jax.random.key(0), (32, 4)) * 2 + 3
  m = _Norm("batch")
  v = jax.jit(lambda: m.init(jax.random.key(1), x, train=False))()
  y, st = m.apply(v, x, train=True, mutable=["batch_stats"])
  np.testing.assert_allclose(y.mean(0), 0.0, atol=1e-5)
  np.testing.assert_allclose(y.var(0), np.var(x, 0) / (np.var(x, 0) + 1e-5), rtol=1e-4)
  # Running mean after one step: 0.9 * 0 + 0.1 * batch mean (PyTorch momentum 0.1).
  np.testing.assert_allclose(st["batch_stats"]["norm"]["mean"], 0.1 * x.mean(0), rtol=1e-5)
  # Eval uses the initial running stats (mean 0, var 1): y = x / sqrt(1 + eps).
  np.testing.assert_allclose(m.apply(v, x, train=False), x / np.sqrt(1 + 1e-5), rtol=1e-5)
  # A batch of one in training has zero deviation from its own mean (every output would be
  # beta), so it is refused; eval is per-sample.
  with pytest.raises(ValueError, match="^model.norm: BatchNorm in training mode"):
    m.apply(v, x[:1], train=True, mutable=["batch_stats"])
  np.testing.assert_allclose(m.apply(v, x[:1], train=False), x[:1] / np.sqrt(1 + 1e-5),
                             rtol=1e-5)


def test_batchnorm_averages_over_the_device_axis():
  # vmap with the pmap axis name emulates 4 devices holding different shards of the batch.
  x = jax.random.normal(jax.random.key(0), (4, 8, 3)) + jnp.arange(4.0)[:, None, None]
  m = _Norm("batch", bn_axis_name="batch")
  v = jax.jit(lambda: m.init(jax.random.key(1), x[0], train=False))()
  f = lambda xs: m.apply(v, xs, train=True, mutable=["batch_stats"])  # noqa: E731
  y, st = jax.vmap(f, axis_name="batch")(x)
  np.testing.assert_allclose(st["batch_stats"]["norm"]["mean"][0], 0.1 * x.reshape(32, 3).mean(0),
                             rtol=1e-5)
  np.testing.assert_allclose(y.reshape(32, 3).mean(0), 0.0, atol=1e-5)
