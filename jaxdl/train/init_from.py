"""`init_from`: a fresh run's parameters taken from a trained base (fine-tuning).

The config's top-level `init_from` (default '': off) names

  a jaxdl workdir        its latest checkpoint's params (`jaxdl.train.checkpoint.load_params`);
                         a LoRA run's adapters folded into its base first (`lora.merge`:
                         W' = W + (alpha / r) A B), so a fine-tuned run can be a base in turn
  a Hugging Face folder  config.json + safetensors (`jaxdl.models.hf.load_hf`)

`resolve(config)` (called by `jaxdl.train.build` before anything else is built) returns the
config the run trains, with every check done before the workdir is touched:

  model    the base's architecture: a run's config.json model section, or the GPT a Hugging
           Face config.json describes (`jaxdl.models.hf.model_from_config`), with the
           run's own `run_fields` (LoRA, dropout, remat, dtypes, ...) on top; so an
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

A `--set model.KEY=V` beside `init_from` (`check_overrides`: `resolve` calls it with the
overrides the config was loaded with, `jaxdl.train.run(..., overrides=)` and so `jaxdl train`,
before anything is written; a sweep's check of each run's config, `jaxdl.sweep.grid.check_config`,
before the sweep writes; `jaxdl doctor`, before its checks) may set only the run's own keys,
those the model's class declares with `setting(..., run_choice=True)`
(`jaxdl.schema.run_choices`: LoRA, dropout, remat, dtypes, attention implementation, ...); an
architecture key whose value differs from the base's would be replaced by the base's value, so it
is refused in one line naming the key, both values.

Only a fresh start reads the weights: a run resuming its own checkpoint continues from that.
Every parameter of the run's model that is not a LoRA adapter (`jaxdl.models.lora.is_adapter`)
is the base's leaf at the same path, which must exist with the same shape; the state is built
without a random copy of the base (`init_state`): the parameters' shapes and shardings come
from the abstract init, only the adapters (and the step, the model state) are computed, by the
run's own init on its own key with the base's leaves dead code XLA drops, so they are bit for
bit what a full init gives them (B = 0, so step 0 computes the base model exactly; a re-run is
the same run); the optimizer state is initialized from the resulting parameters (a parameter
average starts at the base). The base is read straight into the run's parameter shardings (the
named mesh's fsdp and tensor splits, `jaxdl.train.mesh`), each leaf in the run's parameter
dtype: a Hugging Face folder tensor by tensor (`hf.load_hf(shardings=...)`), a run's params
alone through orbax (`jaxdl.train.checkpoint.load_params`, not its optimizer state), a LoRA
run's adapters folded in on the devices; the host never holds the whole base, the devices one
copy of it. A missing path, a shape that differs,
or base parameters the model has no place for are one-line ConfigErrors naming `init_from`
(with the architecture taken from the base, a damaged base only).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections

from jaxdl import models
from jaxdl.config import parse_root
from jaxdl.data import parse_data, records, tokenize
from jaxdl.data.sources import ByteLM
from jaxdl.models import hf, lora
from jaxdl.schema import ConfigError, run_choices

KEY = "init_from"


def run_fields(model_name: str) -> tuple[str, ...]:
  """The model fields that are the fine-tuning run's choices, not the base's architecture (its
  class's `run_choice` settings, `jaxdl.schema.run_choices`): they change what trains and how it
  computes, never the parameters' paths or shapes."""
  builder = models.MODELS[model_name]
  return run_choices(getattr(builder, "model_class", builder))


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


def check_overrides(config, overrides) -> None:
  """A one-line ConfigError when a `model.KEY=V` of `overrides` (`--set`) sets an architecture
  key, one that is not among the run's own (`run_fields`), to another value than the base's
  (module docstring): the run would silently train the base's."""
  path = parse_root(config).init_from
  keys = [item.split("=", 1)[0].strip().removeprefix("config.") for item in overrides]
  given = {k[len("model."):]: config.model[k[len("model."):]] for k in keys
           if path and k.startswith("model.")}
  if not given:
    return
  base = _base_model(path)
  own = run_fields(base["name"])
  for key, value in given.items():
    want = base.get(key, models.model_config(base["name"]).get(key))
    if key not in own and _plain(value) != _plain(want):
      raise ConfigError(f"model.{key}: {value!r} is set, but the run takes its architecture "
                        f"from the base {path!r} ({KEY}), whose {key} is {want!r}; leave "
                        f"model.{key} unset (a fine-tuning run sets only its own model keys: "
                        f"{', '.join(own)})")


def _plain(value):
  return list(value) if isinstance(value, (tuple, list)) else value


def resolve(config, overrides=()):
  """`config` as the run trains it (module docstring): unchanged without `init_from`, else a
  copy whose model section is the base's architecture with the run's `run_fields`, whose data is
  prepared with the base's tokenizer, after every check of the base, of the data's tokenizer and
  of `overrides` (the `key=value` items the config was loaded with, `check_overrides`)."""
  path = parse_root(config).init_from
  if not path:
    return config
  check_overrides(config, overrides)
  base_section, (tok_spec, tok_sha) = _base_model(path), base_tokenizer(path)
  own = config.model.to_dict() if config.get("model") is not None else {}
  fields = models.model_config(base_section["name"])  # every field the base's model has
  section = models.model_config(base_section["name"], **{
      **{k: v for k, v in base_section.items() if k != "name" and k in fields},
      **{k: own[k] for k in run_fields(base_section["name"]) if k in own and k in fields}})
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
  """(spec for `jaxdl.data.tokenize.get_tokenizer`, sha256 fingerprint) of the base's tokenizer, or
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
  elif data_cfg.get("path"):  # a folder not prepared (a typo?): the source would build there
    where = (f"data.path: {data_cfg.get('path')!r} holds no prepared data (no manifest.json), "
             f"and the {data_cfg.get('name')!r} source would be built there with")
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


def base_params(path: str, model, where) -> dict:
  """The params tree of the base at `path` (module docstring) for the run's `model`, each leaf
  in `model.param_dtype` and placed by `where(path_str, shape) -> Sharding` on the devices."""
  full = os.path.expanduser(path)
  if _kind(path) == "hf":
    _, params = hf.load_hf(full, scan_layers=model.scan_layers, param_dtype=model.param_dtype,
                           shardings=lambda key: where("/".join(key), None))
    return params
  from jaxdl.train.checkpoint import load_params  # pylint: disable=g-import-not-at-top
  try:
    params = load_params(full, where)
  except FileNotFoundError as e:
    raise ConfigError(f"{KEY}: {path!r} has no checkpoint yet ({e})") from None
  if lora.split(params)[0]:  # a LoRA run: its adapters folded into the weights they adapt
    with open(os.path.join(full, "config.json")) as f:
      config = ml_collections.ConfigDict(json.load(f))
    _, params = lora.merge(models.build_model(config.model), params)
  return params


def placement(params):
  """`where(path_str, shape) -> Sharding` of a base's leaves (`params`: the run's, arrays or
  shapes with shardings): the sharding of the run's leaf at
  that path and of that shape (shape None: not known yet), else replicated over the run's
  devices (a LoRA base's adapters, folded in and dropped; a leaf the merge then refuses)."""
  leaves = {lora.path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
  some = next(iter(leaves.values())).sharding
  whole = (jax.sharding.NamedSharding(some.mesh, jax.sharding.PartitionSpec())
           if isinstance(some, jax.sharding.NamedSharding) else some)

  def where(name: str, shape):
    x = leaves.get(name)
    ok = x is not None and (shape is None or tuple(shape) == tuple(x.shape))
    return x.sharding if ok else whole

  return where


def merge_base(fresh, base, path: str):
  """`fresh` (the run's params: its adapters as initialized, every other leaf an array or a
  `jax.ShapeDtypeStruct` with a sharding) with every non-adapter leaf taken from `base`, each in
  the fresh leaf's dtype and sharding (a no-op for a base read into them)."""
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
    return jax.device_put(b if b.dtype == x.dtype else b.astype(x.dtype), x.sharding)

  out = jax.tree_util.tree_map_with_path(take, fresh)
  extra = sorted(set(flat_base) - used)
  if extra:
    raise ConfigError(f"{KEY}: {path!r} has parameters this model has no place for ("
                     f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}); merge a LoRA "
                     "base's adapters first, or describe the base's architecture")
  return out


def without_base(state):
  """`state` (a TrainState of arrays, shapes or shardings) without what the base supplies: its
  params reduced to the adapters, {path_str: leaf}, and no optimizer state."""
  params = {lora.path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(state.params)
            if lora.is_adapter(lora.path_str(p))}
  return dataclasses.replace(state, params=params, opt_state=None)


def fresh_init(init_fn, shardings=None):
  """`key -> without_base(init_fn(key))`, jitted into `without_base(shardings)` (None: the
  default device): XLA computes only the returned leaves, so the base's draws never run."""
  def init(key):
    return without_base(init_fn(key))
  return jax.jit(init) if shardings is None else jax.jit(init,
                                                          out_shardings=without_base(shardings))


def init_state(init_fn, key, abstract, shardings, tx, path: str, model):
  """The fresh state of a run whose parameters are the base's at `path`, made without a random
  copy of the base (module docstring).

  `init_fn(key) -> state_0` is the run's whole init (`jaxdl.train.Run.init_fn`) and `abstract`
  its shapes (`Run.abstract_state`). Jitted with only what the base does not supply as its
  output (`fresh_init`: the adapters, the step, the model state), the base's random draws are
  dead code that XLA never computes, and what remains is the same computation on the same key:
  the adapters are bit for bit what the full init gives them. The base is then read into the
  parameters' `shardings` (None: the default device) and dtypes, and the optimizer state is
  initialized from the result, each leaf where `shardings` puts it. Peak on the devices: one
  copy of the base."""
  part = fresh_init(init_fn, shardings)(key)
  if shardings is None:  # the default device, where an unplaced jit puts everything
    params_at = jax.tree.map(lambda _: part.step.sharding, abstract.params)
    opt_init = jax.jit(tx.init)
  else:
    params_at = shardings.params
    opt_init = jax.jit(tx.init, out_shardings=shardings.opt_state)

  def leaf(p, x, at):  # an adapter as initialized; a base leaf its shape, dtype and sharding
    fresh = part.params.get(lora.path_str(p))
    return fresh if fresh is not None else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=at)

  run_params = jax.tree_util.tree_map_with_path(leaf, abstract.params, params_at)
  params = merge_base(run_params, base_params(path, model, placement(run_params)), path)
  return dataclasses.replace(part, params=params, opt_state=opt_init(params))


def model_section_of_hf(path: str) -> dict:
  """The `model` section (name 'gpt' and its plain-valued fields) describing the Hugging Face
  model at `path`, from its config.json (`hf.model_from_config`: a field the GPT cannot
  represent is refused in one line; `hf.read_model`, which reads only the weights' headers)."""
  full = os.path.expanduser(path)
  model = hf.read_model(full)
  hf.weight_files(full)  # every shard there: a damaged base is refused before the run writes
  section = {"name": "gpt"}
  for f in dataclasses.fields(model):
    value = getattr(model, f.name)
    if f.name not in ("parent", "name") and not f.metadata.get("runtime") and (
        value is None or isinstance(value, (bool, int, float, str, tuple))):
      section[f.name] = value
  return section
