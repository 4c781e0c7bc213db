"""Reductions over a whole pytree in a few XLA kernels: `all_finite`, `sum_of_squares`,
`global_norm` and the clipping built on it, `clip_by_global_norm`.

The plain forms reduce each leaf on its own (`jnp.isfinite(x).all()`, `sum(x ** 2)` per leaf),
which is one reduction kernel per leaf. A U-Net's parameters and Adam moments are 303 leaves; its
train step held 303 finiteness reductions and 101 norm reductions, about a third of its compile
time, and on an accelerator each can be a kernel launch of its own. Here the leaves of one dtype
are concatenated, `LEAVES_PER_REDUCTION` at a time, and each concatenation is reduced once:

  all_finite(t)  = AND over chunks C of all(isfinite(concat(C)))
  global_norm(t) = sqrt( sum over chunks C of sum(concat(C)^2) ),  summed in float32

The concatenation is an operand of the reduction's fusion, not a copy: the compiled train steps'
temporary memory and its time per step are unchanged (measured on the CPU at the default flags:
ddpm_digits_cfg 20.5 MB, 35.4 vs 35.5 ms; char_gpt 129.9 MB, 164 vs 167 ms; digits_cnn 11.6 MB,
6.9 vs 6.8 ms). Compile CPU-seconds of the train step, per leaf -> these, three compiles each on
one core under the test suite's XLA flags: ddpm_digits_cfg:smoke 3.69-4.03 -> 2.68-3.03,
char_gpt:smoke 1.05-1.17 -> 0.62-0.73, digits_cnn:smoke 0.61-0.65 -> 0.42-0.49, moons_mlp:smoke
0.35-0.38 -> 0.19-0.29. With the loop's default health signals (`jaxdl.train.watch`, four more sums
of squares per leaf, by `sum_of_squares` per parameter group): ddpm_digits_cfg:smoke 7.35-7.84
-> 3.28-4.52, char_gpt:smoke 1.71-2.26 -> 0.78-1.16, digits_cnn:smoke 0.78-1.04 -> 0.54-0.78;
memory and time per step again unchanged with a watched step every step (20.5 MB, 30.4 vs 28.8
ms; 129.8 MB, 178 vs 181 ms).

Sharded state is reduced leaf by leaf. A concatenation of leaves split over devices in different
ways would make XLA gather them onto each device, which is what FSDP and tensor parallelism exist
to avoid; each leaf's own reduction is local plus one all-reduce of a scalar. The strategies that
shard the state trace their step inside `per_leaf()` (`jaxdl.train.fsdp`).
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import optax

# Leaves per reduction: 32 stays under the cap XLA's GPU backend puts on a fusion's operands and
# outputs (kMaxOperandsAndOutputsPerFusion, 64 in the sources read), so the concatenation is
# fused there too (unmeasured on a GPU: no device this session).
LEAVES_PER_REDUCTION = 32

_trace = threading.local()


@contextlib.contextmanager
def per_leaf():
  """Within it, whatever is traced reduces each leaf on its own (for state sharded over
  devices)."""
  before = getattr(_trace, "per_leaf", False)
  _trace.per_leaf = True
  try:
    yield
  finally:
    _trace.per_leaf = before


def _chunks(tree, cast=None, rows: bool = False):
  """The floating leaves of `tree` (cast to `cast` when given), flattened and concatenated by
  dtype 32 leaves at a time; the flattened leaves themselves within `per_leaf()`. `rows`: each
  leaf flattened to (L, -1) and concatenated along its second axis (leaves stacked over a shared
  leading axis L). Integer leaves are skipped: they are always finite and have no place in a
  norm."""
  by_dtype: dict = {}
  for x in jax.tree.leaves(tree):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      x = x if cast is None else x.astype(cast)
      by_dtype.setdefault(x.dtype, []).append(x.reshape(x.shape[0], -1) if rows else x.ravel())
  if getattr(_trace, "per_leaf", False):
    return [x for group in by_dtype.values() for x in group]
  return [jnp.concatenate(group[i:i + LEAVES_PER_REDUCTION], axis=-1)
          for group in by_dtype.values() for i in range(0, len(group), LEAVES_PER_REDUCTION)]


def all_finite(tree) -> jax.Array:
  """Scalar bool: every element of every floating leaf is finite."""
  checks = [jnp.isfinite(c).all() for c in _chunks(tree)]
  return jnp.stack(checks).all() if checks else jnp.asarray(True)


def sum_of_squares(tree, rows: bool = False) -> jax.Array:
  """sum of x^2 over every floating leaf, in float32: a scalar, or with `rows` one sum per index
  of the leading axis every leaf shares (a scanned stack's layers), shape (L,)."""
  sums = [jnp.sum(jnp.square(c), axis=-1 if rows else None)
          for c in _chunks(tree, jnp.float32, rows)]
  return sum(sums) if sums else jnp.zeros((), jnp.float32)


def global_norm(tree) -> jax.Array:
  """||t||_2 over every floating leaf, as float32 (squares summed in float32)."""
  return jnp.sqrt(sum_of_squares(tree))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """optax.clip_by_global_norm's update, g <- g if ||g|| < c else g c / ||g||, with the norm of
  `global_norm` (the same value up to the order of the float32 sums). Its state is empty, as
  optax's is."""

  def update_fn(updates, state, params=None):
    del params
    g_norm = global_norm(updates)
    trigger = g_norm < max_norm
    updates = jax.tree.map(
        lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), updates)
    return updates, state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)
