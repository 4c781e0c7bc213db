"""LoRA (model.lora_rank, lora_alpha, lora_targets): the adapted model equals the base at init,
the merged model equals the adapted one, targets resolve by name or regex (one that matches
nothing is one line, exit 2), and training through the real engine changes only the adapters,
whose leaves are all the optimizer state holds (jaxdl.models.lora, jaxdl.optim.masks.freeze)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import cli, models
from jaxdl.config import load_config
from jaxdl.models import lora
from jaxdl.schema import ConfigError
from jaxdl.train import build, make_train_step

TINY = dict(vocab_size=32, block_size=16, n_layer=1, d_model=32, n_head=4, n_kv_head=2)
TOK = jax.random.randint(jax.random.key(1), (2, 12), 0, 32)


def _model(**kw):
  return models.build_model(models.gpt_config("", **{**TINY, **kw}))


def test_init_equals_base_and_merged_equals_adapted():
  """Every site adapted (q, k, v with grouped-query widths, o, the MLP's two layers; scanned
  layers here, unrolled in the training test): B = 0 makes the adapted logits the base's, whose
  params are the adapted model's minus the adapters; with nonzero adapters, W + (alpha / r) A B
  folded into the base weights (`lora.merge`) gives the adapted logits to 1e-5."""
  base = _model()
  m = base.clone(lora_rank=4, lora_alpha=8.0, lora_targets=("attn", "mlp"))
  assert m.lora_spec.sites == lora.ATTENTION_SITES + lora.MLP_SITES

  def logits():
    p = m.init(jax.random.key(0), TOK, train=False)["params"]
    p0 = base.init(jax.random.key(0), TOK, train=False)["params"]
    wave = lambda a: 0.3 * jnp.cos(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape)  # noqa: E731
    moved = jax.tree_util.tree_map_with_path(
        lambda path, a: a + wave(a) if lora.is_adapter(lora.path_str(path)) else a, p)
    merged_model, merged = lora.merge(m, moved)
    same_base = jax.tree.map(lambda a, b: jnp.array_equal(a, b), lora.split(p)[1],
                             lora.split(p0)[1])
    return (base.apply({"params": p0}, TOK, train=False), m.apply({"params": p}, TOK, train=False),
            m.apply({"params": moved}, TOK, train=False),
            merged_model.apply({"params": merged}, TOK, train=False), same_base,
            jax.tree.map(jnp.shape, merged) == jax.tree.map(jnp.shape, p0))

  y_base, y_init, y_adapted, y_merged, same_base, same_tree = jax.jit(logits)()
  assert all(same_base.values()) and same_tree  # adding adapters leaves the base init alone
  np.testing.assert_array_equal(y_init, y_base)
  np.testing.assert_allclose(y_merged, y_adapted, atol=1e-5)
  assert float(jnp.abs(y_adapted - y_base).max()) > 1e-2


def test_targets_by_name_or_regex_and_one_that_matches_nothing_is_one_line(tmp_path, capsys):
  sites = lora.ATTENTION_SITES + lora.MLP_SITES
  assert lora.resolve_sites(("v", "q"), sites) == ("attn/q", "attn/v")
  assert lora.resolve_sites(("mlp",), sites) == ("mlp/c_fc", "mlp/c_proj")
  assert lora.resolve_sites(("attn/[ko]", "c_fc"), sites) == ("attn/k", "attn/o", "mlp/c_fc")
  with pytest.raises(ConfigError, match=r"^model.lora_targets: 'q' matches no adaptable layer "
                                        r"of this model; expected .* mlp/c_fc, mlp/c_proj$"):
    _model(lora_rank=2, lora_targets=("q",), mixer="ssm")
  assert _model(lora_targets=("nothing",)).lora_spec is None  # off: the targets are not read
  argv = ["train", "char_gpt:smoke", "--workdir", str(tmp_path / "w"), "--no-progress",
          "--set", "model.lora_rank=4", "--set", "model.lora_targets=['q','attention']"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "model.lora_targets: 'attention' matches no" in err[0], err
  assert not (tmp_path / "w").exists()


def test_a_rank_above_an_adapted_layers_width_is_refused_before_anything_is_made(tmp_path,
                                                                                capsys):
  """r > min(D_in, D_out) of an adapted layer: one line from the settings alone, exit 2, no
  workdir (the rank of 1e9 would otherwise be found out of memory, after config.json)."""
  # TINY: D = 32, H = 4 heads of K = 8, N = 2: attn/k is 32 -> 16 wide, attn/q 32 -> 32.
  assert _model(lora_rank=16, lora_targets=("q", "k")).lora_spec.rank == 16
  with pytest.raises(ConfigError, match=r"^model.lora_rank: must be at most 16, the narrower "
                                        r"side of the adapted layer attn/k \(32 -> 16\); got 17$"):
    _model(lora_rank=17, lora_targets=("q", "k"))
  # SwiGLU's c_fc is 32 -> 2 F = 2 * 85 wide, its c_proj 85 -> 32: the width 32 bounds both.
  with pytest.raises(ConfigError, match=r"at most 32, .* mlp/c_fc \(32 -> 170\); got 33$"):
    _model(lora_rank=33, lora_targets=("mlp",), mlp="swiglu")
  argv = ["train", "char_gpt:smoke", "--workdir", str(tmp_path / "w"), "--no-progress",
          "--set", "model.lora_rank=1000000000"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error: model.lora_rank: must be at most "), err
  assert not (tmp_path / "w").exists()


def test_training_changes_only_adapters_and_the_optimizer_holds_only_them():
  """Three AdamW steps of a tiny char_gpt with lora_rank=4 through the engine's own pieces
  (`jaxdl.train.build`: its chain, state and train step): every base leaf is unchanged bit for
  bit, the adapters moved, and the optimizer state's arrays are the adapters' (Adam's m and v:
  twice their bytes)."""
  config, _ = load_config("char_gpt:smoke", [
      "data.max_bytes=20000", "data.context_length=16", "data.batch_size=4",
      "model.block_size=16", "model.n_layer=1", "model.d_model=16", "model.n_head=2",
      "model.scan_layers=False",
      "model.lora_rank=4", "model.lora_targets=['q','v','mlp']", "train.steps=3"])
  r = build(config)
  state = r.init_state()
  params_0 = jax.device_get(state.params)
  step = make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key, jit=True)
  it = r.ds.train_iter()
  for _ in range(3):
    state, metrics = step(state, next(it))
  adapters_0, base_0 = lora.split(params_0)
  adapters, base = lora.split(jax.device_get(state.params))
  assert len(adapters) == 8 and base.keys() == base_0.keys()
  for path in base:
    np.testing.assert_array_equal(base[path], base_0[path], err_msg=path)
  assert all(np.abs(adapters[p] - adapters_0[p]).max() > 0 for p in adapters)
  arrays = [(lora.path_str(p), x) for p, x in jax.tree_util.tree_leaves_with_path(state.opt_state)
            if x.ndim > 0]
  assert arrays and all(lora.is_adapter(p) for p, _ in arrays), [p for p, _ in arrays]
  assert sum(x.nbytes for _, x in arrays) == 2 * sum(x.nbytes for x in adapters.values())
  assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
