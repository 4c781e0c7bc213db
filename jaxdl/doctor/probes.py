"""Looking inside a model: every module's output in execution order, and per-array statistics.

`capturing_apply(model, sink)` stands in for `model.apply` inside a task's loss: it calls the
model with flax's `capture_intermediates=True` and appends the captured tree to `sink`. Flax
inserts a module's entry when its first output is recorded, and a parent records its own output
after its children, so `module_outputs` (a depth-first walk in insertion order) lists outputs in
the order they were computed: the first non-finite entry is the first module that produced one.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.optim.masks import path_str


def capturing_apply(model, sink: list) -> Callable:
  """`apply_fn` with the task-loss signature that also records every module's output."""

  def apply_fn(variables, *args, **kwargs):
    mutable = kwargs.pop("mutable", False)
    wanted = list(mutable) if mutable else []
    out, updates = model.apply(variables, *args, capture_intermediates=True,
                               mutable=wanted + ["intermediates"], **kwargs)
    updates = dict(updates)
    sink.append(updates.pop("intermediates", {}))
    return (out, updates) if mutable else out

  return apply_fn


def module_outputs(intermediates: Any, prefix: str = "") -> list[tuple[str, jax.Array]]:
  """[(module path, output array)] in execution order; tuple outputs give 'path[i]' entries."""
  out = []
  for key, value in intermediates.items():
    if key == "__call__":
      leaves = [x for v in value for x in jax.tree.leaves(v) if hasattr(x, "dtype")]
      name = prefix.rstrip("/") or "<model>"
      for i, leaf in enumerate(leaves):
        out.append((name if len(leaves) == 1 else f"{name}[{i}]", leaf))
    elif isinstance(value, dict) or hasattr(value, "items"):
      out += module_outputs(value, f"{prefix}{key}/")
  return out


def second_moment(x) -> float:
  """E[x^2] over all entries, in fp32."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    return float("nan")
  return float(jnp.mean(jnp.square(x.astype(jnp.float32))))


def is_finite(x) -> bool:
  x = jnp.asarray(x)
  return bool(jnp.all(jnp.isfinite(x))) if jnp.issubdtype(x.dtype, jnp.inexact) else True


def leaf_norms(tree) -> list[tuple[str, float]]:
  """[(parameter path, ||leaf||_2)] in tree order."""
  return [(path_str(p), float(jnp.linalg.norm(jnp.asarray(x, jnp.float32).ravel())))
          for p, x in jax.tree_util.tree_leaves_with_path(tree)]


def identical_units(params) -> list[str]:
  """Paths of kernels whose output units (last axis, >= 2 of them) are all exactly equal."""
  out = []
  for p, w in jax.tree_util.tree_leaves_with_path(params):
    name = path_str(p)
    if not name.endswith("kernel") or np.ndim(w) < 2 or np.shape(w)[-1] < 2:
      continue
    w_UxO = np.asarray(w, np.float32).reshape(-1, np.shape(w)[-1])
    if np.all(w_UxO == w_UxO[:, :1]):
      out.append(name)
  return out


def unchanged(before, after) -> list[str]:
  """Paths of parameters equal before and after some training."""
  leaves_a = jax.tree_util.tree_leaves_with_path(before)
  leaves_b = jax.tree.leaves(after)
  return [path_str(p) for (p, a), b in zip(leaves_a, leaves_b)
          if np.array_equal(np.asarray(a), np.asarray(b))]


def dtype_counts(tree) -> dict[str, int]:
  counts: dict[str, int] = {}
  for x in jax.tree.leaves(tree):
    if hasattr(x, "dtype"):
      counts[str(x.dtype)] = counts.get(str(x.dtype), 0) + 1
  return counts


def captured(model, run: Callable, *args):
  """`run(apply_fn, *args)` jitted, plus every module's output in execution order.

  The order comes from tracing once with `jax.eval_shape` (where the captured dict keeps its
  insertion order); the values from the jitted call, whose dict outputs come back sorted by key.
  Returns (run's output, [(module path, array)]).
  """
  sink: list = []
  jax.eval_shape(lambda *a: run(capturing_apply(model, sink), *a), *args)
  order = [name for name, _ in module_outputs(sink[-1])]

  def with_outputs(*a):
    inner: list = []
    out = run(capturing_apply(model, inner), *a)
    return out, inner[-1]

  out, tree = jax.jit(with_outputs)(*args)
  by_name = dict(module_outputs(tree))
  return out, [(name, by_name[name]) for name in order]
