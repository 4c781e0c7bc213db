"""Tests for jaxdl.models.dit: the DiT denoiser with adaLN-Zero conditioning."""

import json

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl.models import build_model
from jaxdl.models.denoiser import CondEmbedding
from jaxdl.models.dit import DiTDenoiser, sincos_2d
from jaxdl.models.patches import patchify, unpatchify
from jaxdl.models.stack import unstack_layers
from jaxdl.schema import ConfigError

ZERO_INIT = ("adaLN", "final_adaLN", "final")  # the Dense layers adaLN-Zero starts at 0


@pytest.fixture(scope="module")
def dit():
  model = DiTDenoiser(d_model=16, n_head=2, n_layer=2, emb_dim=16, num_classes=3)
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 8, 8, 1))
  variables = jax.jit(lambda k: model.init(k, x, train=False))(jax.random.PRNGKey(0))
  apply = jax.jit(lambda v, x, t, y: model.apply(v, x, t, y=y, train=False))
  return model, variables, apply, x


def _perturb(params, seed, which):
  """params plus N(0, 0.3^2) noise on the leaves whose path (a tuple of names) `which` accepts."""
  rng = np.random.default_rng(seed)
  return flax.traverse_util.unflatten_dict({
      path: a + 0.3 * rng.standard_normal(a.shape, np.float32) if which(path) else a
      for path, a in flax.traverse_util.flatten_dict(params).items()})


def _skip_path(p, x, t, y):
  """final(mod(LN(patch_embed(x) + pos))) of the fixture's DiT, written out."""
  e_BxE = CondEmbedding(16, 3).apply({"params": p["CondEmbedding_0"]}, t, y)
  c_BxE = jax.nn.silu(e_BxE)
  tok = patchify(x, 2) @ p["patch_embed"]["kernel"] + p["patch_embed"]["bias"]
  tok = tok + sincos_2d(4, 4, 16)
  tok = (tok - tok.mean(-1, keepdims=True)) / jnp.sqrt(tok.var(-1, keepdims=True) + 1e-6)
  a, b = jnp.split(c_BxE @ p["final_adaLN"]["kernel"] + p["final_adaLN"]["bias"], 2, axis=-1)
  tok = tok * (1 + b[:, None]) + a[:, None]
  return unpatchify(tok @ p["final"]["kernel"] + p["final"]["bias"], 2, 8, 8)


def test_patchify_is_undone_by_unpatchify_and_the_position_embedding_formula():
  x = jnp.arange(2 * 4 * 6 * 3, dtype=jnp.float32).reshape(2, 4, 6, 3)
  p_BxTxQ = patchify(x, 2)
  assert p_BxTxQ.shape == (2, 6, 12)
  np.testing.assert_array_equal(p_BxTxQ[0, 1], x[0, 0:2, 2:4].reshape(-1))  # row 0, column 1
  np.testing.assert_array_equal(unpatchify(p_BxTxQ, 2, 4, 6), x)
  pos = sincos_2d(2, 3, 8)  # cell (1, 2) is token 5: [sin, cos of 1 w_k; sin, cos of 2 w_k]
  w = np.array([1.0, 0.01])
  np.testing.assert_allclose(pos[5], np.concatenate([np.sin(w), np.cos(w), np.sin(2 * w),
                                                     np.cos(2 * w)]), atol=1e-6)


def test_adaln_zero_init_outputs_exactly_zero_and_every_block_is_the_identity(dit):
  """At init the output is exactly 0. With only the final layer moved off zero, each block is
  still exactly the identity (its gates are 0), so new attention / MLP weights change nothing
  and the output is the skip path: final(mod(LN(patch_embed(x) + pos))), computed here apart."""
  model, variables, apply, x = dit
  t, y = jnp.array([0.1, 0.5, 0.9]), jnp.array([0, 2, 3])
  out = apply(variables, x, t, y)
  assert out.shape == x.shape and out.dtype == jnp.float32
  np.testing.assert_array_equal(out, np.zeros(x.shape, np.float32))
  head = _perturb(variables["params"], 2, lambda p: p[0] in ZERO_INIT[1:])
  body = _perturb(head, 3, lambda p: p[0] == "h" and p[1] != "adaLN")
  out_head, out_body = apply({"params": head}, x, t, y), apply({"params": body}, x, t, y)
  assert float(jnp.max(jnp.abs(out_head))) > 0.1
  np.testing.assert_array_equal(out_body, out_head)  # bit-exact: the blocks add g * f = 0
  np.testing.assert_allclose(out_head, jax.jit(_skip_path)(head, x, t, y), atol=1e-5)


def test_class_and_time_change_the_output_once_the_zero_init_weights_move(dit):
  model, variables, apply, x = dit
  params = _perturb(variables["params"], 4,
                    lambda p: any(name in ZERO_INIT for name in p))
  v, t = {"params": params}, jnp.full((3,), 0.3)
  out = apply(v, x, t, jnp.array([1, 1, 1]))
  assert not np.allclose(out, apply(v, x, t, jnp.array([2, 2, 2])), atol=1e-3)
  assert not np.allclose(out, apply(v, x, t + 0.2, jnp.array([1, 1, 1])), atol=1e-3)
  # y = None is the null class K = 3, one shared time is B equal per-sample times, and a flat
  # input gives the same numbers flat
  null = apply(v, x, t, jnp.array([3, 3, 3]))
  shared_flat = jax.jit(lambda v: model.apply(v, x.reshape(3, 64), jnp.array([0.3]),
                                              train=False))(v)
  assert shared_flat.shape == (3, 64)
  np.testing.assert_allclose(shared_flat, null.reshape(3, 64), atol=1e-5)
  # the scanned stack equals the unrolled one on the same weights
  unrolled = jax.jit(lambda p: model.clone(scan_layers=False).apply(
      {"params": p}, x, t, y=jnp.array([1, 1, 1]), train=False))
  np.testing.assert_allclose(unrolled(unstack_layers(params, 2)), out, atol=1e-5)


def test_bad_settings_fail_in_one_line_naming_the_key():
  base = dict(name="denoiser_dit", d_model=16, n_head=2, n_layer=1, emb_dim=16)
  for bad, key in ((dict(patch_size=3), "model.patch_size"), (dict(ln="post"), "model.ln"),
                   (dict(d_model=18, n_head=2), "model.d_model")):
    with pytest.raises(ConfigError, match=key):
      build_model(ml_collections.ConfigDict(dict(base, **bad)))


@pytest.mark.slow
def test_fm_digits_cfg_dit_smoke_trains_and_samples(tmp_path, capsys):
  """`fm_digits_cfg:dit,smoke` through the CLI: two steps, then the class check's sampling."""
  from jaxdl import cli
  workdir = tmp_path / "dit"
  assert cli.main(["train", "fm_digits_cfg:dit,smoke", "--workdir", str(workdir), "--no-progress",
                   "--set", "train.steps=2", "--set", "train.eval_every=2", "--set",
                   "train.ckpt_every=2", "--set", "train.plot=False"]) == 0
  out = capsys.readouterr().out
  summary = json.loads(out[out.rindex('{\n  "workdir"'):])
  assert summary["step"] == 2 and np.isfinite(summary["train"]["loss"])
  assert summary["generative"]["num"] == 50 and (workdir / "summary.json").exists()
