"""GPT: exact sizes, its config schema, causality, scan/remat equivalences, KV-cache decoding
and sampling (jaxdl.models.gpt, transformer, decoding)."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models
from jaxdl.models import decoding, gpt, stack

TOK = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)


def _model(**kw):
  return models.build_model(models.gpt_config("tiny", **kw))


def _init(m):
  return jax.jit(lambda: m.init(jax.random.key(0), TOK, train=False))()["params"]


@pytest.fixture(scope="module")
def tiny():
  m = _model()
  return m, _init(m)


@pytest.fixture(scope="module")
def full_forward(tiny):
  m, p = tiny
  return jax.jit(lambda x: m.apply({"params": p}, x, train=False))


@pytest.mark.parametrize("preset,n", [("gpt2-small", 124_439_808), ("gpt2-medium", 354_823_168)])
def test_exact_parameter_counts(preset, n):
  m = models.build_model(models.gpt_config(preset))
  shapes = jax.eval_shape(lambda: m.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32),
                                         train=False))
  assert models.count_params(shapes["params"]) == n
  # The GPT-2 layout written out: embeddings + L (2 LN + attn + MLP, with biases) + final LN.
  cfg = gpt.PRESETS[preset]
  d, L = cfg["d_model"], cfg["n_layer"]
  block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
  assert n == cfg["vocab_size"] * d + cfg["block_size"] * d + L * block + 2 * d


def test_config_keys_are_the_model_fields():
  """The `model` section's keys are GPT's fields (one spelling, default from the class) plus
  'name' and 'preset' (a runtime field, set by a strategy, is none); a key that is not a field
  is an error naming it."""
  fields = {f.name: f.default for f in dataclasses.fields(gpt.GPT)
            if f.init and f.name not in ("parent", "name") and not f.metadata.get("runtime")}
  cfg = models.gpt_config()
  assert set(cfg) == set(fields) | {"name", "preset"}
  built = models.build_model(cfg)
  assert all(getattr(built, k) == v for k, v in fields.items())
  small = models.build_model(ml_collections.ConfigDict(dict(name="gpt", preset="gpt2-small",
                                                             n_layer=2, use_bias=False)))
  assert (small.n_layer, small.d_model, small.use_bias) == (2, 768, False)
  assert models.build_model(models.gpt_config(init_name="he_normal")).init_name == "he_normal"
  with pytest.raises(ValueError, match=r"model.foo: unknown key for model 'gpt'; expected one "
                                       r"of .*, use_bias, "):
    models.build_model(ml_collections.ConfigDict(dict(name="gpt", foo=1)))
  with pytest.raises(ValueError, match="model.foo: unknown key for model 'gpt'"):
    models.gpt_config("tiny", foo=1)
  with pytest.raises(ValueError, match="model.preset: unknown 'gpt9'"):
    models.build_model(ml_collections.ConfigDict(dict(name="gpt", preset="gpt9")))


def test_shapes_finite_jit_and_not(tiny, full_forward):
  m, p = tiny
  y = m.apply({"params": p}, TOK, train=False)
  yj = full_forward(TOK)
  assert y.shape == (2, 12, 64) and y.dtype == jnp.float32
  assert bool(jnp.isfinite(y).all())
  np.testing.assert_allclose(y, yj, atol=1e-5)
  yb = jax.jit(lambda: _model(dtype="bfloat16").apply({"params": p}, TOK, train=False))()
  assert yb.dtype == jnp.float32  # logits are fp32 under a bf16 compute dtype
  np.testing.assert_allclose(yb, y, atol=0.15)


def _position_grad_norms(m, p, t):
  # d logits[:, t] / d wpe[s]: the learned position row s enters the network only at position s.
  def f(wpe):
    q = dict(p, wpe={"embedding": wpe})
    return m.apply({"params": q}, TOK, train=False)[:, t].sum()
  return jnp.abs(jax.jit(jax.grad(f))(p["wpe"]["embedding"])[:12]).sum(-1)


@pytest.mark.parametrize("kw", [{}, dict(ln="post", norm="rms", mlp="swiglu", qk_norm=True,
                                        attn_impl="reference")])
def test_causality_through_gradients(kw, tiny):
  m = _model(**kw)
  p = _init(m) if kw else tiny[1]
  g = _position_grad_norms(m, p, 5)
  assert float(g[6:].max()) == 0.0
  assert float(g[:6].min()) > 0.0


def test_scan_vs_unrolled_and_remat_vs_plain(tiny):
  m, p = tiny
  unrolled, remat = _model(scan_layers=False), _model(remat="full")
  p_unrolled = stack.unstack_layers(p, m.n_layer)
  shapes = jax.eval_shape(lambda: unrolled.init(jax.random.key(0), TOK, train=False))["params"]
  assert jax.tree.map(jnp.shape, shapes) == jax.tree.map(jnp.shape, p_unrolled)

  def loss(model, params):
    logp = jax.nn.log_softmax(model.apply({"params": params}, TOK[:, :-1], train=False))
    return -jnp.take_along_axis(logp, TOK[:, 1:, None], -1).mean()

  l0, g0 = jax.jit(jax.value_and_grad(lambda q: loss(m, q)))(p)
  l1, g1 = jax.jit(jax.value_and_grad(lambda q: loss(unrolled, q)))(p_unrolled)
  l2, g2 = jax.jit(jax.value_and_grad(lambda q: loss(remat, q)))(p)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(l2, l0, rtol=1e-6)
  chex.assert_trees_all_close(stack.stack_layers(g1), g0, atol=1e-6)
  chex.assert_trees_all_close(g2, g0, atol=1e-6)


@pytest.mark.parametrize("kw", [{}, dict(pos="rope", scan_layers=False, attn_impl="chunked")])
def test_kv_cache_matches_full_forward(kw, tiny, full_forward):
  m = _model(**kw)
  p = _init(m) if kw else tiny[1]
  full = (jax.jit(lambda: m.apply({"params": p}, TOK, train=False))() if kw
          else full_forward(TOK))
  cache = decoding.init_cache(m, 2, 16)
  step = jax.jit(lambda p, x, c, pos: m.apply({"params": p}, x, train=False, cache=c, pos=pos))
  logits, cache = step(p, TOK[:, :5], cache, 0)  # prefill
  parts = [logits]
  for i in range(5, 12):
    logits, cache = step(p, TOK[:, i:i + 1], cache, i)
    parts.append(logits)
  np.testing.assert_allclose(jnp.concatenate(parts, 1), full, atol=1e-5)


def test_greedy_generation_equals_argmax_of_full_forward(tiny, full_forward):
  m, p = tiny
  out = decoding.make_generator(m, 6, temperature=0)(p, TOK[:, :4], jax.random.key(0))
  # The slow way: a full forward per token over a fixed-length buffer (causal, so the unfilled
  # tail does not change the logits at position t).
  seq = jnp.zeros_like(TOK).at[:, :4].set(TOK[:, :4])
  for t in range(4, 10):
    seq = seq.at[:, t].set(jnp.argmax(full_forward(seq)[:, t - 1], -1).astype(seq.dtype))
  seq = seq[:, :10]
  np.testing.assert_array_equal(out, seq)
  # A tiny top_p reduces sampling to the argmax.
  np.testing.assert_array_equal(
      decoding.generate(m, p, TOK[:, :4], jax.random.key(4), 6, top_p=1e-6), seq)


def test_sample_logits_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.key(0), 2000)
  one = np.asarray(jax.vmap(lambda k: decoding.sample_logits(k, logits, top_k=1)[0])(keys))
  assert (one == 0).all()
  top2 = np.bincount(np.asarray(jax.vmap(lambda k: decoding.sample_logits(k, logits, top_k=2)[0])(
      keys)), minlength=4)
  assert top2[2:].sum() == 0 and abs(top2[0] / 2000 - 0.5 / 0.8) < 0.04
  # top_p = 0.7 keeps {0.5, 0.3} (mass before token 2 is 0.8 >= 0.7).
  nucleus = np.bincount(np.asarray(jax.vmap(
      lambda k: decoding.sample_logits(k, logits, top_p=0.7)[0])(keys)), minlength=4)
  assert nucleus[2:].sum() == 0 and nucleus[1] > 0
  cold = np.asarray(jax.vmap(
      lambda k: decoding.sample_logits(k, logits, temperature=0.05)[0])(keys))
  assert (cold == 0).mean() > 0.99


def test_bad_inputs():
  m = _model()
  def shape_init(m, x):
    return jax.eval_shape(lambda: m.init(jax.random.key(0), x, train=False))
  with pytest.raises(ValueError, match="exceeds the context of 32"):
    shape_init(m, jnp.zeros((1, 33), jnp.int32))
  with pytest.raises(AssertionError, match="tokens must be int"):
    shape_init(m, jnp.zeros((1, 3, 2), jnp.int32))
  with pytest.raises(ValueError, match="unknown 'gpt9'"):
    models.gpt_config("gpt9")
  with pytest.raises(ValueError, match="expected one of.*swiglu"):
    shape_init(_model(mlp="relu2"), TOK)
  with pytest.raises(ValueError, match="exceeds block_size"):
    decoding.make_generator(m, 30)(None, TOK, jax.random.key(0))


def test_dropout_is_active_only_in_training(tiny, full_forward):
  m, p = _model(dropout=0.5), tiny[1]
  f = jax.jit(lambda k: m.apply({"params": p}, TOK, train=True, rngs={"dropout": k}))
  a, b = f(jax.random.key(1)), f(jax.random.key(2))
  assert float(jnp.abs(a - b).max()) > 1e-3
  assert float(jnp.abs(a - full_forward(TOK)).max()) > 1e-3


def test_drop_path_is_identity_at_eval_and_drops_each_layers_branches_per_example(tiny):
  _, p = tiny
  m = _model(drop_path=0.5, dropout=0.0)
  x = jax.random.randint(jax.random.PRNGKey(0), (512, 4), 0, 64)
  v = {"params": p}
  np.testing.assert_array_equal(m.apply(v, x, train=False), tiny[0].apply(v, x, train=False))
  # Zeroing every residual output projection makes each block the identity: the logits of a
  # sequence whose 2 x 2 branches were all dropped.
  zero_out = lambda path, a: (jnp.zeros_like(a) if "c_proj" in jax.tree_util.keystr(path)  # noqa: E731
                              else a)
  skipped = m.apply(jax.tree_util.tree_map_with_path(zero_out, v), x, train=False)
  y = m.apply(v, x, train=True, rngs={"dropout": jax.random.PRNGKey(1)})
  all_dropped = np.asarray(jnp.abs(y - skipped).max(axis=(1, 2)) < 1e-5)
  # p^4 = 1/16 with a fresh draw per layer (mean 32, sd 5.5); a draw shared by the layers
  # would give p^2 = 1/4 (128).
  assert 12 <= all_dropped.sum() <= 52
  assert np.isfinite(np.asarray(y)).all()
