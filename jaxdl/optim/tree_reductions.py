"""Reductions over a whole pytree in a few XLA kernels: `all_finite`, `sum_of_squares`,
`global_norm` and the clipping built on it, `clip_by_global_norm`.

The plain forms reduce each leaf on its own (`jnp.isfinite(x).all()`, `sum(x ** 2)` per leaf),
which is one reduction kernel per leaf. A U-Net's parameters and Adam moments are 303 leaves; its
train step held 303 finiteness reductions and 101 norm reductions, about a third of its compile
time, and on an accelerator each can be a kernel launch of its own. Here the leaves of one dtype
of at most `SMALL_LEAF` elements (biases, norms' scales: most of the kernels, little of the
memory) are concatenated, `LEAVES_PER_REDUCTION` at a time, each concatenation reduced once; a
larger leaf is reduced on its own:

  all_finite(t)  = AND over chunks C of all(isfinite(concat(C)))
  global_norm(t) = sqrt( sum over chunks C of sum(concat(C)^2) ),  summed in float32

The bound matters because XLA may materialize a concatenation before reducing it. XLA:CPU does:
with every leaf concatenated, the digits MLP's state check held a 1.03 MB copy of its parameters
and Adam moments, and its train step's temporary memory was 1.43 MB (1.34 MB bounded). For the
larger steps the copy was not at the peak: temporary memory and time per step were unchanged (CPU,
default flags: ddpm_digits_cfg 20.5 MB, 35.4 vs 35.5 ms; char_gpt 129.9 MB, 164 vs 167 ms;
digits_cnn 11.6 MB, 6.9 vs 6.8 ms). The bound left compile time within its noise
(ddpm_digits_cfg:smoke with health signals 3.7-5.4 CPU-s bounded vs 4.0-4.9 unbounded;
char_gpt:smoke 1.0-1.3 vs 1.5-1.8). Compile CPU-seconds of the train step, per leaf -> these, three
compiles each on one core under the test suite's XLA flags: ddpm_digits_cfg:smoke 3.69-4.03 ->
2.68-3.03, char_gpt:smoke 1.05-1.17 -> 0.62-0.73, digits_cnn:smoke 0.61-0.65 -> 0.42-0.49,
moons_mlp:smoke 0.35-0.38 -> 0.19-0.29. With the loop's default health signals
(`jaxdl.train.watch`, four more sums of squares per leaf, by `sum_of_squares` per parameter group):
ddpm_digits_cfg:smoke 7.35-7.84 -> 3.28-4.52, char_gpt:smoke 1.71-2.26 -> 0.78-1.16,
digits_cnn:smoke 0.78-1.04 -> 0.54-0.78; memory and time per step again unchanged with a watched
step every step (20.5 MB, 30.4 vs 28.8 ms; 129.8 MB, 178 vs 181 ms).

Sharded state is reduced leaf by leaf. A concatenation of leaves split over devices in different
ways would make XLA gather them onto each device, which is what FSDP and tensor parallelism exist
to avoid; each leaf's own reduction is local plus one all-reduce of a scalar. The strategies that
shard the state trace their step inside `per_leaf()` (`jaxdl.train.mesh`).
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import optax

# Leaves per reduction: 32 stays under the cap XLA's GPU backend puts on a fusion's operands and
# outputs (kMaxOperandsAndOutputsPerFusion, 64 in the sources read).
LEAVES_PER_REDUCTION = 32
# Only leaves of at most this many elements are concatenated; a larger one is reduced on its own.
# XLA may materialize a concatenation before reducing it (XLA:CPU does: a digits MLP's state check
# held a 1.03 MB copy of its parameters and Adam moments), so concatenating whole weight matrices
# could cost a copy of the state; small leaves (biases, norms' scales: most of the kernels, little
# of the memory) bound every concatenation to 32 x 16,384 floats (2 MiB).
SMALL_LEAF = 1 << 14

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
  """The floating leaves of `tree` (cast to `cast` when given), flattened; the small ones
  concatenated by dtype 32 leaves at a time; every leaf on its own within `per_leaf()`. `rows`: each
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
  chunks = []
  for group in by_dtype.values():
    small = [x for x in group if x.size <= SMALL_LEAF]
    chunks += [x for x in group if x.size > SMALL_LEAF]
    chunks += [jnp.concatenate(small[i:i + LEAVES_PER_REDUCTION], axis=-1)
               for i in range(0, len(small), LEAVES_PER_REDUCTION)]
  return chunks


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
