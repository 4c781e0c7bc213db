"""Rotary position embeddings (Su et al., 2021) and their context extensions.

`RopeSpec` names a RoPE's frequencies, `rope_frequencies` computes them as transformers' rope
initialisers do, `apply_rope` rotates query/key features by them. Shapes: B batch, T positions,
H heads, K head width (rotated in pairs (i, i + K/2)).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class RopeSpec:
  """A RoPE's frequencies (`rope_frequencies`): the base theta and a context-extension scaling.

  scaling 'none' (plain RoPE), 'linear' (positions / factor), 'llama3' (Llama 3.1's per-band
  factor between low_freq_factor and high_freq_factor over original_max positions) or 'yarn'
  (NTK-by-parts between beta_fast and beta_slow rotations, cos and sin times attn_factor; 0 means
  YaRN's 0.1 ln(factor) + 1). original_max, the pretraining context L, is the model's context
  where a checkpoint states none (`GPT.rope_spec` resolves it; transformers' default)."""

  theta: float = 10000.0
  scaling: str = "none"
  factor: float = 1.0
  original_max: int = 0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attn_factor: float = 0.0


ROPE_SCALINGS = ("none", "linear", "llama3", "yarn")


def rope_frequencies(rope: RopeSpec, k: int) -> tuple[np.ndarray, float]:
  """(inv_freq (K/2,) float32, attention scaling): feature pair i turns by pos * inv_freq[i], and
  cos, sin are multiplied by the scaling. As transformers' ROPE_INIT_FUNCTIONS compute them
  (in float64 here, rounded once), with w_i = theta^(-2i/K) and factor s:
    none    w_i, 1
    linear  w_i / s, 1
    llama3  with L = original_max and wavelength l_i = 2 pi / w_i: w_i where l_i < L / high,
            w_i / s where l_i > L / low, else (1 - a) w_i / s + a w_i, a = (L / l_i - low) /
            (high - low); scaling 1
    yarn    with d(r) = K ln(L / (2 pi r)) / (2 ln theta), the band lo = max(floor(d(beta_fast)),
            0), hi = min(ceil(d(beta_slow)), K - 1), ramp_i = clip((i - lo) / (hi - lo), 0, 1):
            w_i (1 - ramp_i) + (w_i / s) ramp_i, scaling attn_factor or 0.1 ln(s) + 1 (1 if s <= 1)
  """
  if k % 2:
    raise ValueError(f"rope needs an even head width, got {k}")
  if rope.scaling not in ROPE_SCALINGS:
    raise ValueError(f"rope scaling: unknown {rope.scaling!r}; expected one of {ROPE_SCALINGS}")
  w = 1.0 / rope.theta ** (np.arange(0, k, 2, dtype=np.float64) / k)
  s, big_l, scale = rope.factor, rope.original_max, 1.0
  if rope.scaling in ("llama3", "yarn") and big_l <= 0:
    raise ValueError(f"rope scaling {rope.scaling!r} needs original_max > 0, got {big_l}")
  if rope.scaling == "linear":
    w = w / s
  elif rope.scaling == "llama3":
    lo, hi = rope.low_freq_factor, rope.high_freq_factor
    wavelen = 2 * math.pi / w
    a = (big_l / wavelen - lo) / (hi - lo)
    w = np.where(wavelen > big_l / lo, w / s,
                 np.where(wavelen < big_l / hi, w, (1 - a) * w / s + a * w))
  elif rope.scaling == "yarn":
    dim = lambda r: k * math.log(big_l / (r * 2 * math.pi)) / (2 * math.log(rope.theta))  # noqa: E731
    lo, hi = max(math.floor(dim(rope.beta_fast)), 0), min(math.ceil(dim(rope.beta_slow)), k - 1)
    hi = hi + 0.001 if lo == hi else hi  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(k // 2) - lo) / (hi - lo), 0, 1)
    w = w * (1 - ramp) + (w / s) * ramp
    scale = rope.attn_factor or (0.1 * math.log(s) + 1.0 if s > 1 else 1.0)
  return w.astype(np.float32), float(scale)


def apply_rope(x_BxTxHxK, positions_T, rope: float | RopeSpec = 10000.0):
  """Rotary position embedding: rotates feature pairs (i, i + K/2) by angle pos * inv_freq[i]
  (`rope_frequencies` of `rope`, a RopeSpec or plain RoPE's base theta: base^(-2i/K)), the
  result times the spec's attention scaling (`rotate`).

  `positions_T` is (T,) shared by the batch, or (B, T) per row (packed documents)."""
  rope = rope if isinstance(rope, RopeSpec) else RopeSpec(theta=float(rope))
  inv_freq, scale = rope_frequencies(rope, x_BxTxHxK.shape[-1])
  return rotate(x_BxTxHxK, positions_T, jnp.asarray(inv_freq), scale)


def rotate(x_BxTxHxK, positions_T, inv_freq_K2, scale=1.0):
  """`apply_rope` from the frequencies themselves: inv_freq (K/2,) and the cos/sin scaling may
  be traced values (a layer of a scanned stack picks its RoPE among several: `transformer`'s
  per-layer attention kinds)."""
  ang_TxK2 = positions_T.astype(jnp.float32)[..., None] * inv_freq_K2.astype(jnp.float32)
  # (..., T, 1, K/2): broadcasts over the heads, and over the batch when positions are (T,).
  cos, sin = jnp.cos(ang_TxK2)[..., None, :], jnp.sin(ang_TxK2)[..., None, :]
  if not (isinstance(scale, float) and scale == 1.0):
    cos, sin = cos * scale, sin * scale
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxK.dtype)
