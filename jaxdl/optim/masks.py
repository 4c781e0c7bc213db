"""Which parameters get weight decay, chosen by parameter path.

A parameter's path is its keys joined by '/', e.g. 'dense_0/kernel', 'norm_1/scale'.

Default rule: decay weight matrices (leaves named 'kernel': Dense and Conv weights) and, when
`optim.decay_embeddings` is true, embedding tables (leaves named 'embedding'); never biases,
norm scales or offsets. `optim.decay_mask`, a list of regular expressions, replaces the default
rule: a parameter is decayed iff `re.search` finds any pattern in its path.

Frozen parameters (`freeze`): a chain can train only the parameters a path predicate selects
(a LoRA model's adapters, `jaxdl.models.lora`); the others get a zero update and no optimizer
state, and every link of the chain, clipping included, sees only the trained ones.
"""

from __future__ import annotations

import re
from typing import Callable

import jax
import numpy as np
import optax


def path_str(path) -> str:
  """'a/b/c' from a jax key path (dict keys, attributes or sequence indices)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def path_predicate(patterns, decay_embeddings: bool = False) -> Callable[[str], bool]:
  """`path -> decayed?`: any of the regexes `patterns` found in the path, or (patterns None) the
  default rule: leaf named 'kernel', or 'embedding' when `decay_embeddings`."""
  if patterns is not None:
    if isinstance(patterns, str):
      patterns = [patterns]
    try:
      compiled = [re.compile(p) for p in patterns]
    except re.error as e:
      raise ValueError(f"optim.decay_mask: bad regular expression ({e}); "
                       "expected a list of Python regexes matched against paths "
                       "like 'dense_0/kernel'") from e
    return lambda p: any(c.search(p) for c in compiled)
  names = {"kernel"} | ({"embedding"} if decay_embeddings else set())
  return lambda p: p.rsplit("/", 1)[-1] in names


def mask_of(pred: Callable[[str], bool]) -> Callable:
  """`params -> pytree of bool` (True = decayed) from a path predicate: an optax `mask`."""

  def mask_fn(params):
    return jax.tree_util.tree_map_with_path(lambda p, _: pred(path_str(p)), params)

  return mask_fn


def mask_table(params, pred: Callable[[str], bool], weight_decay: float) -> str:
  """A text table of every parameter: path, shape, size, decayed; totals at the bottom."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  rows = [(path_str(p), tuple(np.shape(x)), int(np.size(x)), pred(path_str(p)))
          for p, x in leaves]
  width = max([len(r[0]) for r in rows] + [9])
  lines = [f"{'parameter':<{width}}  {'shape':<16} {'size':>10}  decayed"]
  for path, shape, size, dec in rows:
    lines.append(f"{path:<{width}}  {str(shape):<16} {size:>10,}  {'yes' if dec else 'no'}")
  n_dec = sum(r[2] for r in rows if r[3])
  n_all = sum(r[2] for r in rows)
  lines.append(f"decayed {n_dec:,} of {n_all:,} parameters "
               f"({sum(r[3] for r in rows)} of {len(rows)} arrays), weight_decay={weight_decay}")
  return "\n".join(lines)


def freeze(tx: optax.GradientTransformation,
           trainable: Callable[[str], bool]) -> optax.GradientTransformation:
  """`tx` on the parameters whose path `trainable` accepts; the others frozen.

  optax.multi_transform({train: tx, frozen: set_to_zero}): tx's state (moments, EMA, ...) holds
  only the trained leaves, its clipping norm is theirs, and a frozen leaf's update is 0 (so its
  gradient, unused, is dropped by XLA unless something else reads it)."""

  def labels(params):
    return jax.tree_util.tree_map_with_path(
        lambda p, _: "train" if trainable(path_str(p)) else "frozen", params)

  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
