"""`init_from`: a fresh run's parameters taken from a trained base (fine-tuning).

The config's top-level `init_from` (default '': off) names

  a jaxdl workdir        its latest checkpoint's params (`jaxdl.train.checkpoint.load_state`);
                         a LoRA run's adapters folded into its base first (`lora.merge`:
                         W' = W + (alpha / r) A B), so a fine-tuned run can be a base in turn
  a Hugging Face folder  config.json + safetensors (`jaxdl.models.hf.load_hf`)

`resolve(config)` (called by `jaxdl.train.build` before anything else is built) returns the
config the run trains, with every check done before the workdir is touched:

  model    the base's architecture: a run's config.json model section, or the GPT a Hugging
           Face config.json describes (`jaxdl.models.hf_families.model_from_config`), with the
           run's own RUN_FIELDS (LoRA, dropout, remat, compute dtype, ...) on top; so an
           experiment's model section never has to describe the base by hand. With
           `model.param_dtype=bfloat16` and LoRA the frozen base is held (and saved) in bf16,
           the adapters in float32 (`jaxdl.models.lora.adapter`): half the base's memory
  data     a source prepared on first use (`data.prepare_with`, e.g. stdlib_instructions) is
           prepared with the base's tokenizer
  refused  (one line, `jaxdl.schema.ConfigError`) a base that is not there or has no
           checkpoint yet, and data whose tokenizer is not the base's: the prepared folder's
           manifest fingerprint (sha256 of the tokenizer's JSON, `jaxdl.data.tokenize`)
           against the base's (a Hugging Face folder's tokenizer.json; a run's data), and a
           tokenizer with more ids than the base's vocab_size. A base whose tokenizer is not
           known (a Hugging Face folder without tokenizer.json, a run whose data folder is gone)
           is checked by vocabulary size only.

Only a fresh start reads the weights: a run resuming its own checkpoint continues from that.
Every parameter of the run's model that is not a LoRA adapter (`jaxdl.models.lora.is_adapter`)
is replaced by the base's leaf at the same path, which must exist with the same shape; adapters
keep their fresh initialization (B = 0, so step 0 computes the base model exactly), and the
optimizer state is initialized again from the new parameters (a parameter average starts at the
base). A missing path, a shape that differs, or base parameters the model has no place for are
one-line ConfigErrors naming `init_from` (with the architecture taken from the base, a damaged
base only).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np

from jaxdl import models
from jaxdl.config import parse_root
from jaxdl.data import parse_data, records, tokenize
from jaxdl.data.sources import ByteLM
from jaxdl.models import hf, hf_families, lora
from jaxdl.schema import ConfigError

KEY = "init_from"
# Model fields that are the fine-tuning run's choices, not the base's architecture: they change
# what trains and how it computes, never the parameters' paths or shapes.
RUN_FIELDS = ("lora_rank", "lora_alpha", "lora_targets", "dropout", "attn_dropout", "drop_path",
              "remat", "scan_unroll", "attn_impl", "dtype", "param_dtype")


def _kind(path: str) -> str:
  """'run' (a jaxdl workdir), 'hf' (a Hugging Face folder) or a one-line ConfigError."""
  full = os.path.expanduser(path)
  if os.path.isdir(os.path.join(full, "checkpoints")):
    return "run"
  if os.path.isfile(os.path.join(full, "config.json")):
    return "hf"
  raise ConfigError(f"{KEY}: {path!r} is neither a jaxdl workdir (with checkpoints/) nor a "
                    "Hugging Face model folder (with config.json); train the base there first "
                    f"(e.g. `jaxdl train bpe_gpt --workdir {path}`)")


def check(config) -> None:
  """A one-line ConfigError, before anything is built, when `init_from` names nothing usable."""
  path = parse_root(config).init_from
  if path:
    _kind(path)


def resolve(config):
  """`config` as the run trains it (module docstring): unchanged without `init_from`, else a
  copy whose model section is the base's architecture with the run's RUN_FIELDS, whose data is
  prepared with the base's tokenizer, after every check of the base and the data's tokenizer."""
  path = parse_root(config).init_from
  if not path:
    return config
  base_section, (tok_spec, tok_sha) = _base_model(path), base_tokenizer(path)
  own = config.model.to_dict() if config.get("model") is not None else {}
  fields = models.model_config(base_section["name"])  # every field the base's model has
  section = models.model_config(base_section["name"], **{
      **{k: v for k, v in base_section.items() if k != "name" and k in fields},
      **{k: own[k] for k in RUN_FIELDS if k in own and k in fields}})
  out = ml_collections.ConfigDict(config.to_dict())
  with out.unlocked():
    out.model = section
    if tok_spec and "prepare_with" in out.data and not out.data.get("path"):
      out.data.prepare_with = tok_spec  # data built on first use speaks the base's tokenizer
  out.lock()
  _check_data_tokenizer(out.data, path, tok_sha, section.get("vocab_size"))
  return out


def _base_model(path: str) -> dict:
  """The model section (a plain dict with 'name') of the base at `path`, read from config files
  alone; a run without a checkpoint yet is refused."""
  full = os.path.expanduser(path)
  if _kind(path) == "hf":
    return model_section_of_hf(full)
  from jaxdl.train.checkpoint import latest_saved_step  # pylint: disable=g-import-not-at-top
  if latest_saved_step(os.path.join(full, "checkpoints")) is None:
    raise ConfigError(f"{KEY}: {path!r} has no checkpoint yet; train it first (or wait for its "
                      "first checkpoint)")
  try:
    with open(os.path.join(full, "config.json")) as f:
      section = dict(json.load(f)["model"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{KEY}: {path!r} has no readable config.json with a model section "
                      f"({type(e).__name__})") from None
  section.update(lora_rank=0)  # its adapters are folded into the weights (`base_params`)
  return section


def base_tokenizer(path: str) -> tuple[str, str | None]:
  """(spec for `jaxdl.data.get_tokenizer`, sha256 fingerprint) of the base's tokenizer, or
  ('', None) when it is not known: a Hugging Face folder's tokenizer.json; a run's data
  (`data_tokenizer`)."""
  full = os.path.expanduser(path)
  if _kind(path) == "hf":
    if not os.path.isfile(os.path.join(full, "tokenizer.json")):
      return "", None
    return full, tokenize.get_tokenizer(full, key=KEY).fingerprint
  try:
    with open(os.path.join(full, "config.json")) as f:
      entry = data_tokenizer(parse_data(json.load(f)["data"]))
  except (OSError, ValueError, KeyError, TypeError):
    return "", None  # a run of another version's data settings: its tokenizer is not known
  return ("", None) if entry is None else (entry["spec"], entry.get("sha256"))


def data_tokenizer(data) -> dict | None:
  """{name, vocab_size, sha256, spec, prepared} of the tokenizer a parsed data section reads
  with, None when that is not known before it is built: a prepared folder's manifest entry
  (`prepared`: True; spec its tokenizer.json), bytes for a byte-level source, or the
  `data.tokenizer` (else `data.prepare_with`) it names."""
  if isinstance(data, ByteLM):
    tok = tokenize.bytes_tokenizer()
    return dict(name=tok.name, vocab_size=tok.vocab_size, sha256=tok.fingerprint, spec="bytes",
                prepared=False)
  directory = data.directory() if hasattr(data, "directory") else ""
  try:
    with open(os.path.join(directory, records.MANIFEST)) as f:
      entry = json.load(f)["tokenizer"]
    own = os.path.join(directory, "tokenizer.json")
    return {**entry, "prepared": True,
            "spec": "bytes" if entry.get("name") == "bytes" else own}
  except (OSError, ValueError, KeyError, TypeError):
    pass  # not a prepared folder, or not prepared yet
  # Else the tokenizer it names, or the one it will be prepared with on first use.
  spec = getattr(data, "tokenizer", None) or getattr(data, "prepare_with", None) or ""
  if spec and spec != "bpe":
    tok = tokenize.get_tokenizer(spec, key="data.tokenizer")
    return dict(name=tok.name, vocab_size=tok.vocab_size, sha256=tok.fingerprint, spec=spec,
                prepared=False)
  return None


def _check_data_tokenizer(data_cfg, path: str, base_sha: str | None, vocab: int | None) -> None:
  """One-line ConfigError when the data's tokenizer is not the base's (module docstring); data
  prepared on first use is made with the base's tokenizer (`resolve`)."""
  entry = data_tokenizer(parse_data(data_cfg))
  if entry is None:
    return
  if entry["prepared"]:
    where = f"data.path: {data_cfg.get('path') or 'the data'!r} was prepared with"
  else:
    where = f"data: the {data_cfg.get('name')!r} source reads with"
  fix = (f"; prepare the data with the base's tokenizer (`jaxdl data prepare SRC --tokenizer "
         f"{path} --out DIR`)")
  ids = entry.get("vocab_size")
  if base_sha is not None and entry.get("sha256") != base_sha:
    raise ConfigError(f"{where} the tokenizer {entry.get('name')!r} ({ids} ids, sha256 "
                      f"{str(entry.get('sha256'))[:12]}), not the tokenizer of the base "
                      f"{path!r} (sha256 {base_sha[:12]}){fix}")
  if vocab and ids and ids > vocab:
    raise ConfigError(f"{where} a tokenizer of {ids} ids, more than the vocab_size {vocab} "
                      f"of the base {path!r}{fix}")


def base_params(path: str) -> dict:
  """The params tree of the base at `path` (module docstring), as host arrays."""
  full = os.path.expanduser(path)
  if os.path.isdir(os.path.join(full, "checkpoints")):
    from jaxdl.train.checkpoint import load_state  # pylint: disable=g-import-not-at-top
    try:
      _, state = load_state(full)
    except FileNotFoundError as e:
      raise ConfigError(f"{KEY}: {path!r} has no checkpoint yet ({e})") from None
    params = jax.device_get(state["params"])
    if lora.split(params)[0]:  # a LoRA run: its adapters folded into the weights they adapt
      with open(os.path.join(full, "config.json")) as f:
        config = ml_collections.ConfigDict(json.load(f))
      _, params = lora.merge(models.build_model(config.model),
                             jax.tree.map(jax.numpy.asarray, params))
    return jax.device_get(params)
  _kind(path)  # neither a run nor a Hugging Face folder: one line
  _, params = hf.load_hf(full)
  return jax.device_get(params)


def merge_base(fresh, base, path: str):
  """`fresh` (the run's initial params) with every non-adapter leaf taken from `base`."""
  flat_base = {lora.path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(base)}
  used = set()

  def take(p, x):
    name = lora.path_str(p)
    if lora.is_adapter(name):
      return x
    if name not in flat_base:
      raise ConfigError(f"{KEY}: {path!r} has no parameter {name!r} (shape {tuple(x.shape)}); "
                       "the model section must describe the base's architecture")
    b = flat_base[name]
    if tuple(b.shape) != tuple(x.shape):
      raise ConfigError(f"{KEY}: {path!r}'s {name!r} has shape {tuple(b.shape)}, the model's "
                       f"{tuple(x.shape)}; the model section must describe the base's "
                       "architecture")
    used.add(name)
    return np.asarray(b).astype(x.dtype)

  out = jax.tree_util.tree_map_with_path(take, fresh)
  extra = sorted(set(flat_base) - used)
  if extra:
    raise ConfigError(f"{KEY}: {path!r} has parameters this model has no place for ("
                     f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}); merge a LoRA "
                     "base's adapters first, or describe the base's architecture")
  return out


def apply(state, tx, path: str):
  """`state` (a fresh TrainState, placed where it lives) with the base's params and the
  optimizer state initialized from them, each leaf keeping its sharding."""
  params = merge_base(jax.device_get(state.params), base_params(path), path)
  params = jax.tree.map(lambda a, x: jax.device_put(a, x.sharding), params, state.params)
  shardings = jax.tree.map(lambda x: x.sharding, state.opt_state)
  opt_state = jax.jit(tx.init, out_shardings=shardings)(params)
  return dataclasses.replace(state, params=params, opt_state=opt_state)


def model_section_of_hf(path: str) -> dict:
  """The `model` section (name 'gpt' and its plain-valued fields) describing the Hugging Face
  model at `path`, from its config.json (`hf_families.model_from_config`: a field the GPT cannot
  represent is refused in one line); only a config that leaves tie_word_embeddings out needs
  the weights, whose lm_head says (`hf.load_hf`)."""
  full = os.path.expanduser(path)
  cfg = hf.read_config(full)
  hf.weight_files(full)  # every shard there: a damaged base is refused before the run writes
  if "tie_word_embeddings" in cfg or cfg["model_type"] == "gpt2":
    model = hf_families.model_from_config(cfg, os.path.join(full, "config.json"))
  else:
    model, _ = hf.load_hf(full)
  section = {"name": "gpt"}
  for f in dataclasses.fields(model):
    value = getattr(model, f.name)
    if f.name not in ("parent", "name") and not f.metadata.get("runtime") and (
        value is None or isinstance(value, (bool, int, float, str, tuple))):
      section[f.name] = value
  return section
