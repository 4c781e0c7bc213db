"""Workarounds for XLA:CPU's compiler: the one module that rewrites traced programs.

Everything here exists for one backend's compiler, evaluates jaxprs through JAX internals
(`jax.extend.core`, primitives' `bind`), and so may break with a JAX release; no other module of
jaxdl imports those internals (one more jaxpr evaluation lives here for that reason alone,
though it is no workaround and no switch turns it off: the watch's ReLU tap,
`with_relu_inputs`). The engine applies it at one call site (`train_program`, where
the loop compiles its train step), on a CPU only, and `train.xla_cpu_workarounds=False` switches
it off (the program as traced: the same numbers, XLA's own layout choices). Model and step code
know nothing of it.

Convolutions inside a loop body (`train_program`). XLA:CPU rewrites convolutions into the layout
its fast (YNNPACK) kernels take (batch, spatial.., feature; kernel spatial.., in, out) only in
the entry computation, so inside a while body, the `lax.scan` over microbatches of
`train.grad_accum` = N > 1 (`jaxdl.train.accumulation`), the weight- and input-gradient
convolutions, which JAX emits in other layouts, fall to slow kernels. The rewrite puts every
convolution of such a loop body in that layout itself, with transposes around it (the same sums,
the same numbers); a step without a loop holding a convolution is left as traced.

Measured on a user's run, `jaxdl train digits_cnn --set train.grad_accum=4` (its batch of 128,
microbatches of 32; `jaxdl bench --only xla_cpu`, `jaxdl.bench.cnn.bench_xla_cpu`), on this
2-core CPU shared with other jobs (load about 7), jax 0.10.2, XLA's default flags, one device,
median of 3 rounds of 5 steps, 2026-12-06:
  step   0.0140 s with the rewrite vs 0.310 s without: 0.045x (22x faster; 1,500 steps: 21 s
         against 7.8 min)
  compile 17.2 s wall with vs 13.1 without (the rewritten body is traced and compiled once)
History: measured first by `jaxdl bench accum` (session 17, `jaxdl.bench.cnn`): without the
rewrite a step at N = 4 took 6-7x the time of 4 microbatch steps for the digits CNN, 9x for the
U-Net; with it 0.97x and 1.03x.

Removed (2026-12-06): the init's random draws hashed together (`jaxdl.train.batched_draws`,
which rewrote the init's jaxpr so that its 136 Threefry calls, for the edm_digits U-Net, ran as
3). On the user's run `jaxdl train edm_digits` (default config, same machine and flags, median
of 3) the init compiled in 4.03 CPU-s (13.8 s wall under that load) with it against 9.05 CPU-s
(36.4 s) without; the train step compiled in 47.9 s and ran 0.048 s a step, 3,000 steps, and the
whole run, evaluation and its after-training sampling included, takes about 17 minutes: 5 CPU-s
saved, under 1% of the run (about 2% by wall clock under load), below the 10% bar. Without it
the test suite's inits compile slower (at its flags: the U-Net's 2.34 against 1.29 CPU-s, the
digits CNN's 0.38 against 0.22, moons_mlp's 0.34 against 0.20). Its bench (`jaxdl bench --only
init`, 2026-12-03, XLA's default flags, smoke configs) had read: edm_digits 6.51 vs 30.4 CPU-s
(0.214x), digits_cnn 1.52 vs 5.36 (0.284x), char_gpt 2.53 vs 3.67 (0.688x); the U-Net at the
suite's flags 1.76 vs 4.19.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

_LOOPS = ("scan", "while")
_CALLS = ("jit", "pjit", "closed_call")


def applies(enabled: bool) -> bool:
  """Whether the workarounds run: switched on (`train.xla_cpu_workarounds`) and on a CPU."""
  return enabled and jax.default_backend() == "cpu"


def _sub_jaxprs(eqn):
  for value in eqn.params.values():
    for sub in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(sub, (jcore.Jaxpr, jcore.ClosedJaxpr)):
        yield getattr(sub, "jaxpr", sub)


def _holds(jaxpr, primitive: str) -> bool:
  """Whether `jaxpr` or any jaxpr nested in it applies `primitive`."""
  return any(e.primitive.name == primitive or any(_holds(s, primitive) for s in _sub_jaxprs(e))
             for e in jaxpr.eqns)


def _loop_with_convolution(jaxpr) -> bool:
  """Whether `jaxpr` holds a loop whose body holds a convolution (at any depth)."""
  return any((e.primitive.name in _LOOPS and _holds(e.params["jaxpr"].jaxpr
                                                     if e.primitive.name == "scan"
                                                     else e.params["body_jaxpr"].jaxpr,
                                                     "conv_general_dilated"))
             or any(_loop_with_convolution(s) for s in _sub_jaxprs(e))
             for e in jaxpr.eqns)


def _bind(eqn, invals: list, **replaced) -> list:
  """`eqn`'s primitive applied to `invals` (with `replaced` params), as `eval_jaxpr` does."""
  with eqn.ctx.manager:
    outs = eqn.primitive.bind(*invals,
                              **eqn.primitive.get_bind_params({**eqn.params, **replaced}))
  return outs if eqn.primitive.multiple_results else [outs]


def _read(env: dict, v):
  return v.val if isinstance(v, jcore.Literal) else env[v]


def _canonical_conv(lhs, rhs, *, dimension_numbers, **params):
  """One convolution in the layout XLA:CPU's fast kernels take, lhs (B, S.., F), rhs (S.., I, O)
  -> out (B, S.., F), with transposes around it: what XLA:CPU's own canonicalization does, but
  only in the entry computation. The same sum, so the same result."""
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  nd = lhs.ndim
  canon_io = (0, nd - 1, *range(1, nd - 1))  # (batch, feature, spatial..) of B S.. F
  canon_k = (nd - 1, nd - 2, *range(nd - 2))  # (out, in, spatial..) of S.. I O
  canon = jax.lax.ConvDimensionNumbers(canon_io, canon_k, canon_io)
  if (tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec)) == tuple(canon):
    return jax.lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=canon, **params)
  lhs = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
  rhs = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
  out = jax.lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=canon, **params)
  perm = [0] * nd  # axis a of the wanted output is axis perm[a] of B S.. F
  perm[out_spec[0]], perm[out_spec[1]] = 0, nd - 1
  for k, a in enumerate(out_spec[2:]):
    perm[a] = 1 + k
  return jnp.transpose(out, perm)


def _evaluate(jaxpr, consts, args, rule: Callable) -> list:
  """`eval_jaxpr` that offers each equation to `rule(eqn, invals) -> outs or None` first (None:
  the equation is bound as it is)."""
  env = dict(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    invals = [_read(env, v) for v in eqn.invars]
    outs = rule(eqn, invals)
    env.update(zip(eqn.outvars, _bind(eqn, invals) if outs is None else outs))
  return [_read(env, v) for v in jaxpr.outvars]


def _canonical_rule(eqn, invals):
  """Every convolution through `_canonical_conv`; nested jit calls inlined so that their
  convolutions are reached too (other sub-jaxprs, e.g. a remat or an inner scan, are bound as
  they are)."""
  if eqn.primitive.name == "conv_general_dilated":
    return [_canonical_conv(*invals, **eqn.params)]
  if eqn.primitive.name in _CALLS and "jaxpr" in eqn.params:
    sub = eqn.params["jaxpr"]
    return _evaluate(sub.jaxpr, sub.consts, invals, _canonical_rule)
  return None


def canonical_convolutions(fn: Callable) -> Callable:
  """`fn` with every convolution of its program in XLA:CPU's fast layout (`_canonical_conv`):
  for a function that runs inside a loop body, where XLA:CPU does not canonicalize."""

  def wrapped(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    outs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), _canonical_rule)
    return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

  return wrapped


def _loop_rule(eqn, invals):
  """Each scan whose body holds a convolution with the body through `canonical_convolutions`;
  calls that hold such a scan inlined to reach it."""
  name = eqn.primitive.name
  if name == "scan" and _holds(eqn.params["jaxpr"].jaxpr, "conv_general_dilated"):
    body = eqn.params["jaxpr"]
    canonical = jax.make_jaxpr(canonical_convolutions(jcore.jaxpr_as_fun(body)))(
        *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in body.in_avals))
    return _bind(eqn, invals, jaxpr=canonical)
  if name in _CALLS and "jaxpr" in eqn.params and _loop_with_convolution(
      eqn.params["jaxpr"].jaxpr):
    sub = eqn.params["jaxpr"]
    return _evaluate(sub.jaxpr, sub.consts, invals, _loop_rule)
  return None


def train_program(train_step: Callable, enabled: bool = True, grad_accum: int = 1) -> Callable:
  """`train_step(state, batch)` as the loop compiles it: on a CPU with the workarounds on and a
  microbatch loop (`grad_accum` > 1), that loop's convolutions in XLA:CPU's fast layout (module
  docstring); else as it is. The same function of its arguments either way."""
  if not applies(enabled) or grad_accum == 1:
    return train_step

  @functools.wraps(train_step)
  def rewritten(state, batch):
    closed, out_shape = jax.make_jaxpr(train_step, return_shape=True)(state, batch)
    leaves = jax.tree.leaves((state, batch))
    if not _loop_with_convolution(closed.jaxpr):  # the program as traced, not traced again
      outs = jcore.jaxpr_as_fun(closed)(*leaves)
    else:
      outs = _evaluate(closed.jaxpr, closed.consts, leaves, _loop_rule)
    return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

  return rewritten


# Not a workaround: the watch's probe (`jaxdl.train.watch`), here because it evaluates a jaxpr.

def _is_relu(eqn) -> bool:
  call = eqn.params.get("call_jaxpr") if eqn.primitive.name == "custom_jvp_call" else None
  return call is not None and getattr(call.jaxpr.debug_info, "func_name", None) == "relu"


def with_relu_inputs(fn: Callable, *args, top: str = "") -> tuple[Any, list[tuple[str, Any]]]:
  """(fn(*args), [(layer, h)]) with h the input of each `jax.nn.relu` that fn calls at its top
  level, in call order; layer is the module scope (less `top`) of the operation producing h.

  The traced program is run once with those inputs as extra outputs: the same computation, no
  second forward pass.
  """
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  jaxpr = closed.jaxpr
  scope, found = {}, []
  for eqn in jaxpr.eqns:
    if _is_relu(eqn) and not isinstance(eqn.invars[0], jcore.Literal):
      found.append((scope.get(eqn.invars[0], ""), eqn.invars[0]))
    scope.update({v: str(eqn.source_info.name_stack) for v in eqn.outvars})
  extended = jaxpr.replace(outvars=[*jaxpr.outvars, *(v for _, v in found)],
                           debug_info=jaxpr.debug_info.with_unknown_names())
  flat = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(extended, closed.consts))(*jax.tree.leaves(args))
  n = len(jaxpr.outvars)
  names, seen = [], {}
  for layer, _ in found:
    parts = layer.split("/")
    layer = "/".join(parts[1:] if parts[0] == top else parts) or "relu"
    seen[layer] = seen.get(layer, 0) + 1
    names.append(layer if seen[layer] == 1 else f"{layer}_{seen[layer] - 1}")
  return jax.tree.unflatten(jax.tree.structure(out_shape), flat[:n]), list(zip(names, flat[n:]))
