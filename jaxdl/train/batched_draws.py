"""A model's initialization with its random draws hashed together: one Threefry call per wave.

A flax model's init derives a key per module (`random_fold_in` of the module's name into its
parent's key) and draws each parameter from its own key (`random_bits`, then the initializer's
transform). Under JAX's default PRNG every fold-in, split and draw is its own Threefry-2x32 hash,
and XLA compiles each separately: the digits U-Net's init (edm_digits) held 136 of them, and they
were most of its compile: 4.2 CPU-s against 1.8 with them hashed in 3 calls at the test suite's
flags, 30.4 against 6.5 at XLA's default ones (`jaxdl bench --only init`).

Threefry-2x32 is elementwise: with keys (k1, k2) and counters (x1, x2) broadcast to one shape,
output i is T(k1_i, k2_i, x1_i, x2_i) and depends on nothing else. So hashes whose inputs are
all known can be flattened, concatenated, hashed in one call and sliced apart, and every output
bit is the same as the separate calls':

  T(concat_j k_j, concat_j x_j) = concat_j T(k_j, x_j)

`batch_draws(closed_jaxpr)` returns a function that computes the jaxpr with its draws so batched
(`batched(fn)` does the same for a Python function). It first writes every `random_fold_in`,
`random_split` and `random_bits` as the key implementation's own code on key data (what JAX
lowers them to), inlining the jit calls around them (those without shardings of their own), then
evaluates the equations in waves: everything computable, then the pending hashes in one call,
until done. A draw of more than `MAX_BATCHED` numbers keeps its own call, so that a sharded init
still hashes only each device's share of a large parameter (JAX's partitionable Threefry). A
scan's body (one layer of `nn.scan`'s stacked layers) is batched on its own: the loop stays,
with fewer hashes per iteration.

The transform uses JAX internals (the key implementations' `*_impl_base` functions, the Threefry
primitive and the unspecified-sharding marker); where a JAX version lacks them, `AVAILABLE` is
False and `batch_draws` returns the plain jaxpr function (tests/test_batched_draws.py fails to
say so).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore

try:  # pylint: disable=g-import-not-at-top
  from jax._src.random import prng as _prng
  from jax._src.random.threefry2x32 import threefry2x32_p as _THREEFRY
  from jax._src.sharding_impls import UNSPECIFIED as _UNSPECIFIED
  _IMPL_BASE = {"random_bits": _prng.random_bits_impl_base,
                "random_split": _prng.random_split_impl_base,
                "random_fold_in": _prng.random_fold_in_impl_base}
  AVAILABLE = True
except (ImportError, AttributeError):  # a JAX without these internals: no batching
  _prng = _THREEFRY = _UNSPECIFIED = None
  _IMPL_BASE = {}
  AVAILABLE = False

# Draws of up to this many numbers share a call (a replicated temporary of at most 2 x 256 KB).
MAX_BATCHED = 1 << 16


def _read(env: dict, v) -> Any:
  return v.val if isinstance(v, jcore.Literal) else env[v]


def _bind(eqn, invals: list, **replaced) -> list:
  """`eqn`'s primitive applied to `invals` (with `replaced` params), as `jax.core.eval_jaxpr`
  applies it."""
  with eqn.ctx.manager:
    outs = eqn.primitive.bind(*invals,
                              **eqn.primitive.get_bind_params({**eqn.params, **replaced}))
  return outs if eqn.primitive.multiple_results else [outs]


def _draws(jaxpr) -> bool:
  """Whether `jaxpr` (or a jit call or scan in it) derives keys or draws bits."""
  return any(e.primitive.name in _IMPL_BASE or e.primitive is _THREEFRY or
             (e.primitive.name in ("jit", "scan") and _draws(e.params["jaxpr"].jaxpr))
             for e in jaxpr.eqns)


def _inlinable(eqn) -> bool:
  """A jit call that draws, with no shardings of its own to keep (inlining would drop them)."""
  return (eqn.primitive.name == "jit" and _draws(eqn.params["jaxpr"].jaxpr) and
          all(s is _UNSPECIFIED for s in (*eqn.params["in_shardings"],
                                          *eqn.params["out_shardings"])))


def _draw(name: str, params: dict, keys, *rest):
  """One key primitive as its implementation's code on the keys' data (Threefry calls)."""
  impl, data = keys.dtype._impl, jax.random.key_data(keys)  # pylint: disable=protected-access
  with jax.disable_jit():  # the implementation's own jit calls, inlined
    if name == "random_bits":
      return _IMPL_BASE[name](impl, data, keys.ndim, **params)
    if name == "random_split":
      out = _IMPL_BASE[name](impl, data, keys.ndim, **params)
    else:  # random_fold_in(keys, msgs)
      out = _IMPL_BASE[name](impl, data, rest[0], keys.shape)
  return jax.random.wrap_key_data(out, impl=keys.dtype)


def _expand(jaxpr, consts, *args) -> list:
  """Evaluates `jaxpr` with its key primitives written as Threefry calls, inlining the jit calls
  that hold them (so that every hash is an equation of one flat jaxpr)."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for e in jaxpr.eqns:
    invals = [_read(env, v) for v in e.invars]
    if e.primitive.name in _IMPL_BASE:
      outs = [_draw(e.primitive.name, e.params, *invals)]
    elif _inlinable(e):
      outs = _expand(e.params["jaxpr"].jaxpr, e.params["jaxpr"].consts, *invals)
    elif e.primitive.name == "scan" and _draws(e.params["jaxpr"].jaxpr):
      # The loop stays; its body (one layer of `nn.scan`) is batched on its own.
      body = e.params["jaxpr"]
      hashed = jax.make_jaxpr(batch_draws(body))(
          *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in body.in_avals))
      outs = _bind(e, invals, jaxpr=hashed)
    else:
      outs = _bind(e, invals)
    env.update(zip(e.outvars, outs))
  return [_read(env, v) for v in jaxpr.outvars]


def _hash_together(eqns: list, env: dict) -> None:
  """The Threefry equations `eqns` (inputs all known) as one call over their concatenation."""
  if len(eqns) == 1:
    env.update(zip(eqns[0].outvars, _bind(eqns[0], [_read(env, v) for v in eqns[0].invars])))
    return
  shapes = [e.outvars[0].aval.shape for e in eqns]
  k1, k2, x1, x2 = (lax.concatenate([jnp.broadcast_to(_read(env, e.invars[i]), s).reshape(-1)
                                     for e, s in zip(eqns, shapes)], 0) for i in range(4))
  o1_N, o2_N = _THREEFRY.bind(k1, k2, x1, x2)
  start = 0
  for e, s in zip(eqns, shapes):
    stop = start + math.prod(s)
    env[e.outvars[0]] = lax.slice(o1_N, (start,), (stop,)).reshape(s)
    env[e.outvars[1]] = lax.slice(o2_N, (start,), (stop,)).reshape(s)
    start = stop


def _in_waves(jaxpr, consts, *args) -> list:
  """Evaluates a flat `jaxpr` in waves: every equation whose inputs are known, except the small
  Threefry calls, which wait and then run as one call; repeated until every output is known."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  pending = list(jaxpr.eqns)
  while pending:
    waiting, hashes = [], []
    for e in pending:  # in the jaxpr's order, so one pass computes all it can
      if not all(isinstance(v, jcore.Literal) or v in env for v in e.invars):
        waiting.append(e)
      elif e.primitive is _THREEFRY and math.prod(e.outvars[0].aval.shape) <= MAX_BATCHED:
        hashes.append(e)
      else:
        env.update(zip(e.outvars, _bind(e, [_read(env, v) for v in e.invars])))
    if hashes:
      _hash_together(hashes, env)
    pending = waiting
  return [_read(env, v) for v in jaxpr.outvars]


def batch_draws(closed: jcore.ClosedJaxpr) -> Callable[..., list]:
  """`closed`'s function (flat arguments -> flat outputs, as `jaxpr_as_fun`) with its random
  draws hashed together per wave (module docstring): the same bits, fewer Threefry calls."""
  if not (AVAILABLE and _draws(closed.jaxpr)):
    return jcore.jaxpr_as_fun(closed)

  def hashed(*args):
    flat = jax.make_jaxpr(lambda *a: _expand(closed.jaxpr, closed.consts, *a))(*args)
    return _in_waves(flat.jaxpr, flat.consts, *args)
  return hashed


def batched(fn: Callable) -> Callable:
  """`fn` (a pure function of arrays, such as `Run.init_fn()`'s `key -> state`) with its random
  draws batched: traced to a jaxpr at each call's shapes, then `batch_draws`. Jit the result."""

  def wrapped(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    flat = batch_draws(closed)(*jax.tree.leaves(args))
    return jax.tree.unflatten(jax.tree.structure(out_shape), flat)
  return wrapped
