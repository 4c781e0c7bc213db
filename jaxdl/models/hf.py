"""Hugging Face model directories <-> jaxdl GPT: GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3 and
Gemma 1-3, one way in and one way out.

`load_hf(dir) -> (model, params)` and `save_hf(dir, model, params)`; `special_ids(dir)` the
bos / eos / pad ids generation stops and pads with, `save_tokenizer` the tokenizer files of an
export (tokenizer.json, tokenizer_config.json with the special tokens and chat template).

A directory holds config.json and the weights, one model.safetensors or the shards that
model.safetensors.index.json names ({"weight_map": {tensor: file}}); the tokenizer.json beside
them is `jaxdl.data.tokenize.load_hf_tokenizer`'s. What each family's config fields and tensors
mean as a GPT (the conversion tables, and what is refused) is `jaxdl.models.hf_families`' (Gemma's
config.json: `jaxdl.models.hf_gemma`'s), chosen by model_type in `jaxdl.models.hf_config`
(`model_from_config`, `export_type`, used here and by the commands as `hf.`'s).

safetensors file: 8-byte little-endian header length N, then N bytes of JSON
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian C-order bytes (offsets relative to the end of the header). Read and
written here with numpy, so no extra package is needed; read lazily (`index_weights`: the headers,
then one tensor at a time as `load_hf` assembles the parameters), so loading never holds a whole
shard, and the checkpoint's dtype is kept (bf16 stays bf16 unless `param_dtype` widens it).
"""

from __future__ import annotations

import json
import os
import struct

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxdl.models import hf_tensors
from jaxdl.models.gpt import GPT
from jaxdl.models.hf_config import MODEL_TYPES, export_type, hf_config, model_from_config
from jaxdl.models.hf_families import refuse
from jaxdl.schema import ConfigError

INDEX = "model.safetensors.index.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
              "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
def read_config(directory: str) -> dict:
  """config.json of a Hugging Face model directory, refusing a missing or unreadable one."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise ConfigError(f"{directory}: no config.json (expected a Hugging Face model directory)")
  try:
    with open(path, encoding="utf-8") as f:
      cfg = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e})".splitlines()[0]) from None
  if cfg.get("model_type") not in MODEL_TYPES:
    refuse(path, "model_type", cfg.get("model_type"), f"one of {', '.join(MODEL_TYPES)}")
  return cfg


def weight_files(directory: str) -> list[str]:
  """The weight files of a directory: model.safetensors, or the shards
  model.safetensors.index.json names, or with neither pytorch_model.bin or the shards its index
  names (`read_bin`: refused here in one line, saying how to convert, when torch is not
  installed); a missing one is a one-line ConfigError (checked before anything is read, so a
  run refuses a damaged base before it writes)."""
  index = os.path.join(directory, INDEX)
  if _bin_only(directory):
    _import_torch(directory)
    index = os.path.join(directory, BIN_FILES[1])
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ConfigError(f"{index}: no weight_map (expected {{tensor name: shard file}})")
    files = sorted(set(weight_map.values()))
  elif os.path.isfile(os.path.join(directory, "model.safetensors")):
    files = ["model.safetensors"]
  elif _bin_only(directory):
    files = [BIN_FILES[0]]
  else:
    raise ConfigError(f"{directory}: no model.safetensors or {INDEX}")
  for name in files:
    if not os.path.isfile(os.path.join(directory, name)):
      raise ConfigError(f"{index}: shard {name} is missing from {directory}")
  return files


def index_weights(directory: str) -> dict:
  """{tensor name: `LazyTensor`} over every shard, from their headers alone: nothing is read
  until numpy asks for a tensor (np.asarray), one tensor at a time. The PyTorch files of a
  directory without safetensors are read through torch (`BIN_FILES`)."""
  if _bin_only(directory):
    return read_bin(directory)
  out = {}
  for name in weight_files(directory):
    try:
      out.update(safetensors_index(os.path.join(directory, name)))
    except ValueError as e:
      raise ConfigError(str(e).splitlines()[0]) from None
  return out


def read_weights(directory: str) -> dict[str, np.ndarray]:
  """Every tensor of model.safetensors, or of the shards model.safetensors.index.json names."""
  return {k: np.asarray(v) for k, v in index_weights(directory).items()}


class LazyTensor:
  """One tensor of a safetensors file, read (seek + readinto one buffer of its own dtype) when
  numpy asks for it: `np.asarray(t)`; `.shape` and `.dtype` without reading."""
  __slots__ = ("path", "offset", "shape", "dtype")

  def __init__(self, path: str, offset: int, shape: tuple, dtype):
    self.path, self.offset, self.shape, self.dtype = path, offset, shape, np.dtype(dtype)

  def __array__(self, dtype=None, copy=None):
    a = np.empty(self.shape, self.dtype)
    with open(self.path, "rb") as f:
      f.seek(self.offset)
      if f.readinto(a.reshape(-1).view(np.uint8)) != a.nbytes:
        raise ConfigError(f"{self.path}: truncated (a tensor runs past the end of the file)")
    return a if dtype is None else a.astype(dtype, copy=False)


def _header(path: str) -> tuple[dict, int]:
  """(the JSON header, where the data begins) of a safetensors file, reading only those."""
  with open(path, "rb") as f:
    head = f.read(8)
    size = os.fstat(f.fileno()).st_size
    if len(head) < 8:
      raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
      raise ValueError(f"{path}: header length {n} runs past the end of the file")
    return json.loads(f.read(n).decode("utf-8")), 8 + n


def safetensors_index(path: str) -> dict[str, LazyTensor]:
  """{name: LazyTensor} of a safetensors file (module docstring), offsets checked."""
  header, start = _header(path)
  data_size = os.path.getsize(path) - start
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _ST_DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}; "
                       f"expected one of {sorted(_ST_DTYPES)}")
    dt = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end > data_size or end - begin != int(np.prod(shape)) * dt.itemsize:
      raise ValueError(f"{path}: tensor {name!r} offsets {begin}..{end} do not hold "
                       f"{info['dtype']} {list(shape)}")
    out[name] = LazyTensor(path, start + begin, shape, dt)
  return out


# PyTorch's pickled checkpoints, read only through torch (a pickle runs code; torch's
# weights_only loader refuses anything but tensors).
BIN_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def _bin_only(directory: str) -> bool:
  return (not os.path.isfile(os.path.join(directory, "model.safetensors")) and
          not os.path.isfile(os.path.join(directory, INDEX)) and
          any(os.path.isfile(os.path.join(directory, f)) for f in BIN_FILES))


def _import_torch(directory: str):
  """torch, or the one-line ConfigError saying how to convert a PyTorch-only directory."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(
        f"{directory}: holds only PyTorch weights (pytorch_model.bin), which need torch to read: "
        "pip install torch, or convert once where transformers is installed: python -c \"import "
        "transformers as t; t.AutoModelForCausalLM.from_pretrained('DIR').save_pretrained('OUT')"
        "\" (writes safetensors)") from None
  return torch


def read_bin(directory: str) -> dict[str, np.ndarray]:
  """The tensors of pytorch_model.bin (or its shards), through torch when it is installed (each
  file memory-mapped, dtype kept); without torch a one-line ConfigError saying how to convert
  the directory to safetensors."""
  torch = _import_torch(directory)
  out = {}
  for name in weight_files(directory):
    state = torch.load(os.path.join(directory, name), map_location="cpu", weights_only=True,
                       mmap=True)
    for k, t in state.items():
      # numpy has no bfloat16: its bits, viewed as ml_dtypes' bfloat16.
      out[k] = (t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
                if t.dtype == torch.bfloat16 else t.numpy())
  return out


def write_weights(directory: str, tensors: dict[str, np.ndarray],
                  max_shard_bytes: int | None = None) -> list[str]:
  """model.safetensors, or with `max_shard_bytes` shards model-0000i-of-0000n.safetensors of at
  most that size (a larger tensor alone) and model.safetensors.index.json; returns the files."""
  names = sorted(tensors)
  shards, size = [[]], 0
  for name in names:
    n = tensors[name].nbytes
    if max_shard_bytes and shards[-1] and size + n > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += n
  if not max_shard_bytes or len(shards) == 1:
    files = {"model.safetensors": names}
    if os.path.exists(os.path.join(directory, INDEX)):  # a stale index would be read first
      os.remove(os.path.join(directory, INDEX))
  else:
    files = {f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors": s
             for i, s in enumerate(shards)}
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
             "weight_map": {n: f for f, s in files.items() for n in s}}
    with open(os.path.join(directory, INDEX), "w", encoding="utf-8") as f:
      json.dump(index, f, indent=2)
  for name, members in files.items():
    write_safetensors(os.path.join(directory, name), {n: tensors[n] for n in members},
                              {"format": "pt"})  # transformers reads only 'pt'-format files
  return list(files)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a safetensors file as numpy arrays (each read on its own)."""
  return {k: np.asarray(v) for k, v in safetensors_index(path).items()}


def write_safetensors(path: str, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
  """Writes tensors (any numpy/jax arrays of the supported dtypes) as one safetensors file."""
  header, blobs, offset = {}, [], 0
  for name in sorted(tensors):
    a = np.ascontiguousarray(np.asarray(tensors[name]))
    if a.dtype not in _ST_NAMES:
      raise ValueError(f"write_safetensors: {name!r} has unsupported dtype {a.dtype}")
    b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    header[name] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape),
                    "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
  if metadata:
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  h = json.dumps(header, separators=(",", ":")).encode("utf-8")
  h += b" " * (-len(h) % 8)  # the format pads the header to a multiple of 8 with spaces
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
      f.write(b)
  os.replace(tmp, path)


def load_hf(path: str, *, scan_layers: bool = True, dtype=jnp.float32, param_dtype=None,
            shardings=None, **overrides) -> tuple[GPT, dict]:
  """A Hugging Face model directory (module docstring) -> (GPT, params).

  `dtype` is the compute dtype; `param_dtype` the parameters', by default the checkpoint's own
  (its floating tensors' widest dtype: a bf16 checkpoint stays bf16, nothing is widened on the
  way); `overrides` set other GPT fields (attn_impl, dropout, ...). The weights are read tensor by
  tensor into their final dtype and placed on the device parameter by parameter, each straight
  into its sharding when `shardings` (a tree like the params, or fn(path) -> Sharding) gives one
  (`hf_tensors.to_params`): the host never holds the whole checkpoint, nor a float32 copy of
  it (`jaxdl bench --only hf_load` measures the peak)."""
  cfg = read_config(path)
  tensors = index_weights(path)
  if param_dtype is None:
    floats = {np.dtype(t.dtype) for t in tensors.values() if np.dtype(t.dtype).kind == "f" or
              np.dtype(t.dtype) == ml_dtypes.bfloat16}
    param_dtype = max(floats, key=lambda d: d.itemsize) if floats else jnp.float32
  model = read_model(path, tensors, scan_layers=scan_layers, dtype=dtype,
                     param_dtype=param_dtype, **overrides)
  return model, hf_tensors.to_params(tensors, model, cfg["model_type"], path, shardings)


def read_model(path: str, tensors=None, **fields) -> GPT:
  """The GPT (with `fields` on top) a directory's config.json describes
  (`model_from_config`); a config that leaves tie_word_embeddings out is untied when
  the weights hold lm_head.weight (`tensors`, else the shards' headers alone)."""
  cfg = read_config(path)
  model = model_from_config(cfg, os.path.join(path, "config.json"), **fields)
  if "tie_word_embeddings" not in cfg and cfg["model_type"] != "gpt2":
    # Its default moved (transformers 4: tied, 5: untied): a head in the weights says untied.
    tensors = index_weights(path) if tensors is None else tensors
    model = model.clone(tie_embeddings="lm_head.weight" not in tensors)
  return model


def _json(path: str) -> dict:
  """A JSON object file, {} when absent; unreadable is a one-line ConfigError."""
  if not os.path.isfile(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e})".splitlines()[0]) from None
  return obj if isinstance(obj, dict) else {}


def token_text(value) -> str | None:
  """A tokenizer_config.json token: a string or an AddedToken {"content": ...}."""
  value = value.get("content") if isinstance(value, dict) else value
  return value if isinstance(value, str) else None


def special_ids(directory: str, token_to_id=None) -> dict:
  """{'bos': id | None, 'eos': [ids], 'pad': id | None} of a Hugging Face directory, where
  transformers' `generate` finds them: generation_config.json's bos/eos/pad_token_id (eos an id or
  a list), else config.json's, else tokenizer_config.json's bos_token / eos_token / pad_token
  strings looked up with `token_to_id` (the tokenizer.json's). eos [] means none: generation
  then runs to its length, as transformers' does."""
  configs = [_json(os.path.join(directory, n)) for n in (GENERATION_CONFIG, "config.json")]
  tok_cfg = _json(os.path.join(directory, TOKENIZER_CONFIG))
  out = {}
  for key in ("bos", "eos", "pad"):
    value = next((c[f"{key}_token_id"] for c in configs if c.get(f"{key}_token_id") is not None),
                 None)
    if value is None and token_to_id is not None and token_text(tok_cfg.get(f"{key}_token")):
      value = token_to_id(token_text(tok_cfg[f"{key}_token"]))
    if key == "eos":
      value = [] if value is None else [value] if isinstance(value, int) else list(value)
    out[key] = value
  return out


def save_hf(out_dir: str, model: GPT, params: dict, *, model_type: str | None = None,
            max_shard_bytes: int | None = None, dtype=np.float32, specials: dict | None = None
            ) -> list[str]:
  """Writes config.json, generation_config.json and the weights (sharded past
  `max_shard_bytes`) for `transformers`.

  model_type: 'llama' / 'mistral' / 'qwen2' / 'qwen3' / 'phi3' / 'gpt2' / 'gemma' / 'gemma2' /
  'gemma3_text'; default gpt2 for learned positions, Gemma's for norm='rms1p', else qwen3 with
  qk_norm, qwen2 with qkv_bias, phi3 with longrope or partial rotary, mistral with a sliding
  window, llama otherwise (`export_type`, which refuses a model the layout cannot hold). specials:
  `special_ids`' {'bos', 'eos', 'pad'}, written as bos/eos/pad_token_id to config.json and
  generation_config.json (eos one id or a list, as transformers reads it). Returns the weight
  files written."""
  model_type = export_type(model, model_type)
  tensors = hf_tensors.to_tensors(params, model, model_type, dtype)
  os.makedirs(out_dir, exist_ok=True)
  files = write_weights(out_dir, tensors, max_shard_bytes)
  cfg = hf_config(model, model_type)
  # The weights' dtype under both names: transformers 5 reads `dtype`, 4.x `torch_dtype`.
  cfg["dtype"] = cfg["torch_dtype"] = np.dtype(dtype).name
  ids = {}
  for key, value in (specials or {}).items():
    if key == "eos" and value is not None:
      value = (list(value) if len(value) != 1 else value[0]) if len(value) else None
    ids[f"{key}_token_id"] = value
  cfg.update(ids)
  with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=2)
  with open(os.path.join(out_dir, GENERATION_CONFIG), "w", encoding="utf-8") as f:
    json.dump({"_from_model_config": False, **ids}, f, indent=2)
  return files


def save_tokenizer(out_dir: str, tokenizer_json: str, specials: dict, id_to_token, *,
                   model_max_length: int, chat_template: str | None = None) -> None:
  """tokenizer.json (copied) and tokenizer_config.json beside an export, so `AutoTokenizer`
  loads it with its special tokens: bos_token / eos_token / pad_token are the texts of
  `specials`' ids (`id_to_token`, the tokenizer's; the first eos), and the chat template when
  there is one."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copy(tokenizer_json, os.path.join(out_dir, "tokenizer.json"))
  cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
         "clean_up_tokenization_spaces": False}
  for key in ("bos", "eos", "pad"):
    value = specials.get(key)
    value = (value[0] if value else None) if key == "eos" else value
    if value is not None and id_to_token(value) is not None:
      cfg[f"{key}_token"] = id_to_token(value)
  if chat_template is not None:
    cfg["chat_template"] = chat_template
  with open(os.path.join(out_dir, TOKENIZER_CONFIG), "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=2)
