"""Parameter shardings from logical axis names: one rules table for every mesh strategy.

Two tables, read together:
  PARAM_AXES     regex over a leaf's path ('params/h/attn/c_attn/kernel', also matching the
                 optimizer's and the EMA's copies of that parameter) -> the logical names of its
                 last dimensions (a scanned stack's leading layer axis is left unnamed)
  LOGICAL_RULES  logical name -> mesh axis ('tensor', 'expert'), or None: not split by name
so a strategy asks `param_spec(path, shape, mesh_sizes)` and never knows a layer's name. The
parameters themselves are untouched (no `nn.with_logical_partitioning` boxes): names, shapes and
values stay those of the checkpoints and the GPT-2 import.

Tensor parallelism (Megatron-LM, Shoeybi et al., 2019) over T devices of the 'tensor' axis, in
the row-vector convention y = x W of `nn.Dense`:
  attention  c_attn W (D, (H + 2N) K) split by columns, so each device holds 1/T of the query,
             key and value columns; c_proj W_O (H K, D) split by rows (its input, the heads):
             y = sum_t o_t W_O[t], a partial sum XLA all-reduces
  MLP        c_fc (D, F) by columns (SwiGLU: (D, 2F), [gate | up]), c_proj (F, D) by rows
  vocab      wte (V, D) and lm_head (D, V) by the vocabulary V: the tied head x wte^T yields
             logits split over V, and XLA reduces the softmax's max and sum across devices
  experts    expert_fc (E, D, F), expert_proj (E, F, D): E over 'expert', F over 'tensor'
Everything unnamed (norms, biases of D outputs, positions, the router) is replicated over
'tensor'. The fused projections (c_attn's [q | k | v], SwiGLU's [gate | up], kv_proj's [k | v])
keep their parameter layout, so their contiguous 1/T column slices do not hold whole heads (or
matching gate and up units): the weights still fall as 1/T, and XLA's SPMD partitioner moves
the projected activations to the head split that c_proj's row split asks for (a collective per
layer that a head-major layout would not need).

FSDP composes by shape, not by name (`fsdp_spec`): 'fsdp' takes the largest dimension that no
named axis took and that F divides, so it covers models without names too.
A named dimension that its mesh axis does not divide is replicated and logged; the config check
(`check_tensor`) refuses such a model before anything is built when it knows its widths.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxdl.optim import masks
from jaxdl.schema import ConfigError

log = logging.getLogger("jaxdl")

# The mesh axes (`jaxdl.train.mesh`), outermost first.
DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
EXPERT_AXIS = "expert"
SEQUENCE_AXIS = "sequence"
TENSOR_AXIS = "tensor"
MESH_AXES = (DATA_AXIS, FSDP_AXIS, EXPERT_AXIS, SEQUENCE_AXIS, TENSOR_AXIS)

# (regex searched in the '/'-joined path, logical names of the leaf's last dimensions).
PARAM_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"(^|/)wte/embedding$", ("vocab", "embed")),
    (r"(^|/)wpe/embedding$", (None, "embed")),
    (r"(^|/)lm_head/kernel$", ("embed", "vocab")),
    (r"attn/c_attn/kernel$", ("embed", "qkv")),
    (r"attn/c_attn/bias$", ("qkv",)),
    (r"attn/q_proj/kernel$", ("embed", "heads")),
    (r"attn/q_proj/bias$", ("heads",)),
    (r"attn/kv_proj/kernel$", ("embed", "kv_heads")),
    (r"attn/kv_proj/bias$", ("kv_heads",)),
    (r"attn/c_proj/kernel$", ("heads", "embed")),
    (r"attn/lora_q/b$", (None, "heads")),
    (r"attn/lora_[kv]/b$", (None, "kv_heads")),
    (r"attn/lora_o/a$", ("heads", None)),
    (r"mlp/c_fc/kernel$", ("embed", "mlp")),
    (r"mlp/c_fc/bias$", ("mlp",)),
    (r"mlp/c_proj/kernel$", ("mlp", "embed")),
    (r"mlp/lora_c_fc/b$", (None, "mlp")),
    (r"mlp/lora_c_proj/a$", ("mlp", None)),
    (r"mlp/expert_fc$", ("expert", "embed", "mlp")),
    (r"mlp/expert_proj$", ("expert", "mlp", "embed")),
)
_COMPILED = tuple((re.compile(rx), names) for rx, names in PARAM_AXES)

LOGICAL_RULES: dict[str, str | None] = {
    "vocab": TENSOR_AXIS,     # the embedding's rows, the untied head's columns
    "heads": TENSOR_AXIS,     # H K query (or attention-output) features, by head
    "kv_heads": TENSOR_AXIS,  # N K key/value features
    "qkv": TENSOR_AXIS,       # the fused (H + 2N) K columns of c_attn
    "mlp": TENSOR_AXIS,       # the MLP hidden width F (2F for SwiGLU's fused c_fc)
    "expert": EXPERT_AXIS,    # a mixture's E experts
    "embed": None,            # the model width D: left to FSDP's shape rule
}


def path_name(path) -> str:
  """'params/h/attn/c_attn/kernel' from a jax key path or its `keystr` form."""
  if isinstance(path, str):
    return "/".join(re.findall(r"[A-Za-z0-9_]+", path))
  return masks.path_str(path)


def logical_axes(path, rank: int) -> tuple[str | None, ...]:
  """The logical name of each of a leaf's `rank` dimensions (None: unnamed); all None when no
  rule matches or the leaf has fewer dimensions than the rule names."""
  name = path_name(path)
  for rx, names in _COMPILED:
    if rx.search(name) and rank >= len(names):
      return (None,) * (rank - len(names)) + names
  return (None,) * rank


def fsdp_spec(shape: tuple[int, ...], fsdp_size: int) -> P:
  """The shape rule: split the largest dimension n_i with n_i % F == 0 (the first on ties) over
  'fsdp'; P() if none does or F = 1."""
  best = None
  for i, n in enumerate(shape):
    if n % fsdp_size == 0 and n >= fsdp_size and (best is None or n > shape[best]):
      best = i
  if best is None or fsdp_size == 1:
    return P()
  return P(*[FSDP_AXIS if i == best else None for i in range(len(shape))])


def param_spec(path, shape: tuple[int, ...], sizes: dict[str, int]) -> P:
  """The PartitionSpec of a leaf at `path` on a mesh of axis `sizes`: named dimensions on their
  mesh axes (when the axis has > 1 device and divides the dimension), then 'fsdp' on a free
  dimension by `fsdp_spec`. P() when nothing is split."""
  spec: list[Any] = [None] * len(shape)
  for i, logical in enumerate(logical_axes(path, len(shape))):
    axis = LOGICAL_RULES.get(logical) if logical else None
    if axis and sizes.get(axis, 1) > 1 and shape[i] % sizes[axis] == 0:
      spec[i] = axis
  f = sizes.get(FSDP_AXIS, 1)
  if f > 1:  # taken dimensions count as width 1, which F > 1 never divides
    rest = fsdp_spec(tuple(1 if s else n for s, n in zip(spec, shape)), f)
    spec = [s or r for s, r in zip(spec, list(rest) + [None] * (len(shape) - len(rest)))]
  return P(*spec) if any(spec) else P()


def sharding_table(state, sizes: dict[str, int]) -> list[tuple[str, tuple, str]]:
  """(path, shape, spec) for every leaf of `state` on a mesh of axis `sizes`."""
  return [(jax.tree_util.keystr(path), tuple(np.shape(leaf)),
           str(param_spec(path, tuple(np.shape(leaf)), sizes)))
          for path, leaf in jax.tree_util.tree_leaves_with_path(state)]


def unsplit_named(state, sizes: dict[str, int]) -> list[tuple[str, tuple, str]]:
  """(path, shape, mesh axis) of every parameter whose named dimension its mesh axis (of > 1
  devices) does not divide, so it stays whole along that dimension."""
  rows = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(getattr(state, "params", state)):
    shape = tuple(leaf.shape)
    for logical, n in zip(logical_axes(path, len(shape)), shape):
      axis = LOGICAL_RULES.get(logical) if logical else None
      if axis and sizes.get(axis, 1) > 1 and n % sizes[axis]:
        rows.append((path_name(path), shape, axis))
  return rows


def tensor_split_params(params, tensor: int) -> list[str]:
  """The paths of the parameters that a 'tensor' axis of `tensor` devices splits."""
  return [path_name(p) for p, leaf in jax.tree_util.tree_leaves_with_path(params)
          if TENSOR_AXIS in tuple(param_spec(p, tuple(leaf.shape), {TENSOR_AXIS: tensor}))]


def tensor_widths(model) -> dict[str, int]:
  """The widths of `model` that tensor parallelism splits, by the config key that sets them:
  H query heads, N key/value heads, the MLP hidden width F, the vocabulary V (those it has)."""
  out = {}
  if getattr(model, "mixer", None) != "ssm" and getattr(model, "n_head", None):
    out["model.n_head"] = model.n_head
    out["model.n_kv_head"] = getattr(model, "kv_heads", model.n_head)
  if hasattr(model, "mlp_width"):  # F with mlp_hidden's 0 resolved (`TransformerModel.mlp_width`)
    out["model.mlp_hidden"] = model.mlp_width
  if getattr(model, "vocab_size", None):
    out["model.vocab_size"] = model.vocab_size
  return out


def check_tensor(model, tensor: int) -> None:
  """Refuses a 'tensor' axis of T > 1 that does not divide every width of `model` it splits
  (one line naming the key); models without such widths are checked by `check_layout`."""
  if tensor == 1:
    return
  for key, n in tensor_widths(model).items():
    if n % tensor:
      what = "the MLP hidden width" if key == "model.mlp_hidden" else key
      raise ConfigError(f"parallel.tensor: {tensor} does not divide {what} ({key}={n}); use a "
                        f"divisor of {n} or parallel.tensor=1")


def check_layout(params, tensor: int, model_name: str) -> None:
  """Refuses T > 1 for a model none of whose parameters the rules split (a CNN, an MLP): it
  would run replicated on every device of the tensor axis."""
  if tensor > 1 and not tensor_split_params(params, tensor):
    raise ConfigError(f"parallel.tensor: model {model_name!r} has no parameter that tensor "
                      f"parallelism splits (the rules in jaxdl.train.sharding_rules name a "
                      f"transformer's heads, MLP and vocabulary); use parallel.tensor=1")
