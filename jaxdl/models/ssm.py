"""A selective state-space mixer (Mamba-style): an input-dependent diagonal linear recurrence.

Shapes: B batch, T time, D model width, E inner width (expand D), N state size per channel,
K conv width.

  u = silu(conv_K(x W_u)),  z = x W_z             (E each; z gates the output)
  delta_t = softplus(u_t W_delta + b_delta)      (E: a per-channel, input-dependent step)
  B_t = u_t W_B,  C_t = u_t W_C                  (N: input-dependent input and output maps)
  A = -exp(A_log)                                (E x N, diagonal and negative: a stable decay)
  h_t = exp(delta_t A) * h_{t-1} + delta_t B_t u_t    (E x N state, h_0 = 0)
  y_t = C_t . h_t + D_skip * u_t,   out_t = (y_t * silu(z_t)) W_out

conv_K is Mamba's short causal depthwise convolution, (conv_K u)_t = sum_j w_j u_{t-K+1+j} + c
per channel: it lets a token see its K - 1 predecessors before the recurrence, which is what
associative recall needs (bind a value to the key just before it; Zoology, Arora et al. 2023).

Training evaluates the recurrence for all t at once with `jax.lax.associative_scan` on pairs
(a, b) meaning h -> a h + b, composed as (a1, b1) then (a2, b2) = (a2 a1, a2 b1 + b2): O(T)
work, O(log T) depth. Decoding carries the state (h (B, E, N), the last K - 1 pre-conv inputs
(B, K - 1, E)), whose size does not grow with T (`step`).

Packed documents (`segment_ids` (B, T), each document one run of equal ids, as
`jaxdl.data.packing` makes them): a document starts at s_t = [t > 0 and id_t != id_{t-1}], and
r_t = s_1 + ... + s_t numbers the runs. Both places where a token reads its past stop there:

  h_t = (1 - s_t) exp(delta_t A) * h_{t-1} + delta_t B_t u_t   (at a start: as from h = 0)
  (conv_K u)_t = sum_j w_j [r_{t-K+1+j} = r_t] u_{t-K+1+j} + c  (taps before a start read 0)

so a document's u, h and outputs are exactly those it gets alone from the zero state (up to the
scan's float reassociation). In the scan the zero decay a_s = 0 cuts every product a_t ... a_s
that carries h_{s-1} forward. Decoding (a state) continues one document and takes no ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SsmSpec:
  """The mixer's sizes (hashable, so it can be a module field); the GPT builds it from its
  ssm_* fields."""
  state: int   # N per channel
  expand: int  # E = expand D
  conv: int    # K, the causal convolution's width (1: no mixing before the recurrence)


def _combine(left, right):
  """(a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2."""
  a1, b1 = left
  a2, b2 = right
  return a2 * a1, a2 * b1 + b2


class SelectiveSSM(nn.Module):
  """x (B, T, D) -> (B, T, D) by the recurrence of the module docstring.

  `__call__(x, segment_ids=None)` scans all T in parallel, restarting at each packed document;
  `step(x_BxD, h_BxExN) -> (out_BxD, h)` advances one token; `init_state(batch)` is h_0 = 0.
  """

  features: int  # D, the width of x
  cfg: Any  # the block's settings (`transformer.BlockSpec`): ssm_spec, initializers, dtypes

  def setup(self):
    cfg = self.cfg
    kinit = cfg.kernel_init
    dense = lambda n, name, **kw: nn.Dense(n, dtype=cfg.dtype, param_dtype=cfg.param_dtype,  # noqa: E731
                                           name=name, **kw)
    self.in_proj = nn.DenseGeneral((2, self.inner), use_bias=False, kernel_init=kinit,
                                   dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="in_proj")
    self.delta_proj = dense(self.inner, "delta_proj", kernel_init=kinit,
                            bias_init=nn.initializers.constant(-2.0))  # softplus(-2) = 0.13
    self.bc_proj = dense(2 * self.spec.state, "bc_proj", use_bias=False, kernel_init=kinit)
    self.out_proj = dense(self.features, "out_proj", use_bias=False, kernel_init=cfg.out_init)
    # A_log = log(1..N) per channel (S4D-real), so the decays cover several time scales.
    self.a_log = self.param("a_log", lambda k, s: jnp.log(jnp.broadcast_to(
        jnp.arange(1, s[1] + 1, dtype=jnp.float32), s)), (self.inner, self.spec.state))
    self.d_skip = self.param("d_skip", nn.initializers.ones, (self.inner,))
    # Depthwise taps w (K, E), uniform(+-1/sqrt(K)) like a fan-in-K conv; the last tap is t itself.
    bound = self.spec.conv ** -0.5
    self.conv_w = self.param("conv_w", lambda k, s: jax.random.uniform(k, s, jnp.float32, -bound,
                                                                          bound),
                             (self.spec.conv, self.inner))
    self.conv_b = self.param("conv_b", nn.initializers.zeros, (self.inner,))

  @property
  def spec(self) -> SsmSpec:
    return self.cfg.ssm_spec

  @property
  def inner(self) -> int:
    return self.spec.expand * self.features

  def _mix_in(self, x_BxTxD, tail_BxKm1xE, run_BxT=None):
    """(u, z, new tail): u = silu(conv_K(x W_u)) over the tail's K - 1 earlier inputs then x's;
    with run ids r (module docstring) tap j of token t reads 0 unless r_{t-K+1+j} = r_t."""
    u_BxTxE, z_BxTxE = jnp.moveaxis(self.in_proj(x_BxTxD), -2, 0)
    b, t = u_BxTxE.shape[:2]
    k = self.spec.conv
    ext_BxT1xE = jnp.concatenate([tail_BxKm1xE.astype(u_BxTxE.dtype), u_BxTxE], axis=1)
    taps = [ext_BxT1xE[:, j:j + t] for j in range(k)]
    if run_BxT is not None:
      run_BxT1 = jnp.concatenate([jnp.zeros((b, k - 1), run_BxT.dtype), run_BxT], axis=1)
      taps = [jnp.where((run_BxT1[:, j:j + t] == run_BxT)[..., None], tap, 0)
              for j, tap in enumerate(taps)]
    conv_BxTxE = sum(tap * self.conv_w[j] for j, tap in enumerate(taps))
    return jax.nn.silu(conv_BxTxE + self.conv_b).astype(self.cfg.dtype), z_BxTxE, ext_BxT1xE[:, t:]

  def _inputs(self, u):
    """(decay a, input b, C) of the recurrence for u (..., E); fp32 for the state."""
    delta = jax.nn.softplus(self.delta_proj(u).astype(jnp.float32))
    b_in, c_out = jnp.split(self.bc_proj(u).astype(jnp.float32), 2, axis=-1)
    a = jnp.exp(delta[..., None] * -jnp.exp(self.a_log))
    b = (delta * u.astype(jnp.float32))[..., None] * b_in[..., None, :]
    return a, b, c_out

  def _output(self, h, c_out, u, z):
    y = jnp.einsum("...en,...n->...e", h, c_out) + self.d_skip * u.astype(jnp.float32)
    return self.out_proj((y * jax.nn.silu(z.astype(jnp.float32))).astype(self.cfg.dtype))

  def __call__(self, x_BxTxD, state=None, segment_ids=None):
    """All T at once from the zero state; with a state (h0, tail), continues from it and also
    returns the state after x (cached decoding: h_t = (a_t ... a_1) h0 + the scan's h_t from 0).
    `segment_ids` (B, T) restart the recurrence and the convolution at each document's start
    (module docstring)."""
    if state is not None and segment_ids is not None:
      raise ValueError("SelectiveSSM: a state continues one document; segment_ids are for the "
                       "full forward of packed documents (model.mixer='ssm')")
    h0_BxExN, tail = self.init_state(x_BxTxD.shape[0]) if state is None else state
    start_BxT = run_BxT = None
    if segment_ids is not None:
      start_BxT = jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)))
      run_BxT = jnp.cumsum(start_BxT, axis=1, dtype=jnp.int32)
    u, z, tail = self._mix_in(x_BxTxD, tail, run_BxT)
    a_BxTxExN, b_BxTxExN, c_BxTxN = self._inputs(u)
    if start_BxT is not None:  # a = 0 at a start: h_s = b_s forgets the previous document
      a_BxTxExN = jnp.where(start_BxT[:, :, None, None], 0.0, a_BxTxExN)
    a_BxTxExN, h_BxTxExN = jax.lax.associative_scan(_combine, (a_BxTxExN, b_BxTxExN), axis=1)
    if state is None:
      return self._output(h_BxTxExN, c_BxTxN, u, z)
    h_BxTxExN = a_BxTxExN * h0_BxExN[:, None] + h_BxTxExN
    return self._output(h_BxTxExN, c_BxTxN, u, z), (h_BxTxExN[:, -1], tail)

  def step(self, x_BxD, state):
    """One token: h <- a h + b, out from h; the state (h, tail) keeps its size."""
    h_BxExN, tail = state
    u, z, tail = self._mix_in(x_BxD[:, None], tail)
    a, b, c = self._inputs(u[:, 0])
    h_BxExN = a * h_BxExN + b
    return self._output(h_BxExN, c, u[:, 0], z[:, 0]), (h_BxExN, tail)

  def init_state(self, batch: int):
    """(h_0 = 0 (B, E, N) fp32, the K - 1 inputs before t = 0 = 0 (B, K - 1, E))."""
    return (jnp.zeros((batch, self.inner, self.spec.state), jnp.float32),
            jnp.zeros((batch, self.spec.conv - 1, self.inner), self.cfg.dtype))
