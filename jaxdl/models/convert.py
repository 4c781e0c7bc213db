"""GPT-2 weights in the Hugging Face safetensors layout <-> jaxdl GPT params.

safetensors file: 8-byte little-endian header length N, then N bytes of JSON
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian C-order bytes (offsets relative to the end of the header). Read and
written here with numpy, so no extra package is needed.

GPT2LMHeadModel names (prefix 'transformer.' optional on read) and their jaxdl params:
  wte.weight (V, D) -> wte.embedding         wpe.weight (S, D) -> wpe.embedding
  h.{i}.ln_1.{weight,bias} -> h.ln_1.{scale,bias}      (likewise ln_2, ln_f)
  h.{i}.attn.c_attn.{weight (D, 3D), bias} -> h.attn.c_attn.{kernel, bias}
  h.{i}.attn.c_proj / mlp.c_fc / mlp.c_proj -> h.attn.c_proj / h.mlp.c_fc / h.mlp.c_proj
GPT-2's Conv1D stores weight as (in, out), already a flax Dense kernel: no transposes.
Buffers (attn.bias, attn.masked_bias) and the tied lm_head.weight are skipped on read.
"""

from __future__ import annotations

import json
import os
import re
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxdl.models.gpt import GPT
from jaxdl.models.transformer import unstack_layers

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
              "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a safetensors file as numpy arrays (views on one read of the file)."""
  with open(path, "rb") as f:
    raw = f.read()
  if len(raw) < 8:
    raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
  (n,) = struct.unpack("<Q", raw[:8])
  if n > len(raw) - 8:
    raise ValueError(f"{path}: header length {n} runs past the end of the file")
  header = json.loads(raw[8:8 + n].decode("utf-8"))
  data = memoryview(raw)[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _ST_DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}; "
                       f"expected one of {sorted(_ST_DTYPES)}")
    dt = np.dtype(_ST_DTYPES[info["dtype"]])
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end > len(data) or end - begin != int(np.prod(shape)) * dt.itemsize:
      raise ValueError(f"{path}: tensor {name!r} offsets {begin}..{end} do not hold "
                       f"{info['dtype']} {list(shape)}")
    out[name] = np.frombuffer(data[begin:end], dtype=dt.newbyteorder("<")).reshape(shape)
  return out


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


# ---------------------------------------------------------------------------------------------
# GPT-2 name mapping.

_BLOCK = {"ln_1.weight": ("ln_1", "scale"), "ln_1.bias": ("ln_1", "bias"),
          "attn.c_attn.weight": ("attn", "c_attn", "kernel"),
          "attn.c_attn.bias": ("attn", "c_attn", "bias"),
          "attn.c_proj.weight": ("attn", "c_proj", "kernel"),
          "attn.c_proj.bias": ("attn", "c_proj", "bias"),
          "ln_2.weight": ("ln_2", "scale"), "ln_2.bias": ("ln_2", "bias"),
          "mlp.c_fc.weight": ("mlp", "c_fc", "kernel"), "mlp.c_fc.bias": ("mlp", "c_fc", "bias"),
          "mlp.c_proj.weight": ("mlp", "c_proj", "kernel"),
          "mlp.c_proj.bias": ("mlp", "c_proj", "bias")}
_TOP = {"wte.weight": ("wte", "embedding"), "wpe.weight": ("wpe", "embedding"),
        "ln_f.weight": ("ln_f", "scale"), "ln_f.bias": ("ln_f", "bias")}
_SKIP = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")


def _check_gpt2_layout(model: GPT) -> None:
  want = dict(ln="pre", norm="layer", mlp="gelu", pos="learned", use_bias=True,
              tie_embeddings=True, qk_norm=False, mlp_hidden=0)
  bad = [f"{k}={getattr(model, k)!r} (GPT-2 has {v!r})" for k, v in want.items()
         if getattr(model, k) != v]
  if bad:
    raise ValueError("GPT-2 weights need the GPT-2 architecture; model has " + ", ".join(bad))


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _gpt2_items(model: GPT):
  """(hf_name, jaxdl path in the unrolled layout) for every GPT-2 tensor of `model`."""
  for k, path in _TOP.items():
    yield k, path
  for i in range(model.n_layer):
    for k, path in _BLOCK.items():
      yield f"h.{i}.{k}", (f"h_{i}",) + path


def gpt2_to_params(tensors: dict[str, np.ndarray], model: GPT) -> dict:
  """GPT-2 state dict (HF names) -> jaxdl params for `model` (scanned or unrolled layout).

  Raises ValueError naming every missing, misshaped or unexpected tensor.
  """
  _check_gpt2_layout(model)
  tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
  shapes = jax.eval_shape(lambda: model.clone(scan_layers=False).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32), train=False))["params"]
  params, missing, misshaped, used = {}, [], [], set()
  for name, path in _gpt2_items(model):
    want = _get(shapes, path)
    if name not in tensors:
      missing.append(name)
      continue
    used.add(name)
    a = tensors[name]
    if tuple(a.shape) != tuple(want.shape):
      misshaped.append(f"{name}: {tuple(a.shape)}, expected {tuple(want.shape)}")
      continue
    node = params
    for p in path[:-1]:
      node = node.setdefault(p, {})
    node[path[-1]] = np.asarray(a)
  extra = sorted(k for k in tensors if k not in used and not _SKIP.match(k))
  if missing or misshaped or extra:
    msg = [f"missing: {missing}" if missing else "", f"misshaped: {misshaped}" if misshaped else "",
           f"unexpected: {extra}" if extra else ""]
    raise ValueError("GPT-2 import: " + "; ".join(m for m in msg if m))
  if model.scan_layers:  # stacked in numpy: jnp.stack would compile a program per shape
    layers = [params.pop(f"h_{i}") for i in range(model.n_layer)]
    params["h"] = jax.tree.map(lambda *a: np.stack(a), *layers)
  return jax.tree.map(lambda a: jnp.asarray(a, model.param_dtype), params)


def params_to_gpt2(params: dict, model: GPT, prefix: str = "transformer.",
                   dtype=np.float32) -> dict[str, np.ndarray]:
  """jaxdl params -> GPT-2 state dict with HF names (GPT2LMHeadModel, tied head omitted)."""
  _check_gpt2_layout(model)
  params = jax.tree.map(np.asarray, params)  # indexed in numpy: no program per layer slice
  if "h" in params:
    params = unstack_layers(params, model.n_layer)
  return {prefix + name: np.asarray(_get(params, path), dtype=dtype)
          for name, path in _gpt2_items(model)}


def hf_config(model: GPT) -> dict:
  """A config.json for GPT2LMHeadModel matching `model`."""
  return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
          "vocab_size": model.vocab_size, "n_positions": model.block_size,
          "n_ctx": model.block_size, "n_embd": model.d_model, "n_layer": model.n_layer,
          "n_head": model.n_head, "layer_norm_epsilon": model.epsilon,
          "activation_function": "gelu_new", "tie_word_embeddings": True}


def save_gpt2(directory: str, params: dict, model: GPT, dtype=np.float32) -> str:
  """Writes `directory/model.safetensors` and `config.json`; returns the safetensors path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "model.safetensors")
  write_safetensors(path, params_to_gpt2(params, model, dtype=dtype), {"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config(model), f, indent=2)
  return path


def load_gpt2(path: str, model: GPT | None = None, *, n_head: int | None = None,
              **model_overrides) -> tuple[GPT, dict]:
  """Reads a GPT-2 `model.safetensors` (or a directory holding it) -> (model, params).

  Without `model`, the architecture comes from the tensors' shapes (V, D, L, context) and the
  head count H from `n_head` or else from `config.json` beside the file; the shapes alone do not
  determine H, so with neither it is a ValueError. `model_overrides` (e.g. dropout, dtype,
  scan_layers) are applied to the model either way.
  """
  if os.path.isdir(path):
    path = os.path.join(path, "model.safetensors")
  if not os.path.exists(path):
    raise FileNotFoundError(f"GPT-2 import: no file at {path}")
  tensors = read_safetensors(path)
  if model is None:
    t = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    for need in ("wte.weight", "wpe.weight"):
      if need not in t:
        raise ValueError(f"GPT-2 import: missing: ['{need}'] in {path}")
    v, d = t["wte.weight"].shape
    n_layer = 1 + max((int(m.group(1)) for k in t if (m := re.match(r"h\.(\d+)\.", k))),
                      default=-1)
    cfg_path = os.path.join(os.path.dirname(path), "config.json")
    hf = {}
    if os.path.exists(cfg_path):
      with open(cfg_path) as f:
        hf = json.load(f)
    n_head = n_head or hf.get("n_head")
    if not n_head:
      raise ValueError(f"GPT-2 import: the number of heads is not in the weights and there is "
                       f"no config.json beside {path}; pass n_head=H (or model=)")
    if d % n_head:
      raise ValueError(f"GPT-2 import: width {d} is not divisible by n_head={n_head}")
    model = GPT(vocab_size=v, block_size=t["wpe.weight"].shape[0], n_layer=n_layer,
                n_head=n_head, d_model=d, epsilon=hf.get("layer_norm_epsilon", 1e-5))
  elif n_head is not None and n_head != model.n_head:
    raise ValueError(f"GPT-2 import: n_head={n_head} but the given model has {model.n_head}")
  model = model.clone(**model_overrides) if model_overrides else model
  return model, gpt2_to_params(tensors, model)
