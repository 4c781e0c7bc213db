"""Rotary position embeddings (Su et al., 2021) and their context extensions.

`RopeSpec` names a RoPE's frequencies, `rope_frequencies` computes them as transformers' rope
initialisers do, `apply_rope` rotates query/key features by them. Shapes: B batch, T positions,
H heads, K head width, R = int(K partial) rotated features (pairs (i, i + R/2); the K - R after
them pass unrotated: Phi-4-mini's partial rotary).

Frequencies that follow the length (transformers' `dynamic_rope_update`): 'dynamic' (NTK) and
'longrope' compute them from n, the length one call reaches (its largest position + 1, over the
batch), so every token of a call turns by the same frequencies and, with a KV cache, a key keeps
the rotation of the call that computed it:
  dynamic   n <= L: plain RoPE; n > L: theta' = theta (s n / L - (s - 1))^(R / (R - 2)). In
            cached decoding the prompt turns by those of its own length and each new token by
            those of its position + 1, the cached keys as they were: transformers' `generate`
            token for token. (transformers' rotary module also keeps state: after a call of
            length M > L, a later call of length L <= n <= M reuses M's frequencies until a
            call shorter than L resets them; jaxdl keeps none, a call's frequencies are its own
            n's, which is what a generation from a fresh or reset module computes.)
  longrope  w_i / short_i up to n = L, w_i / long_i past it: a call past L turns every position,
            the first L too, by the long factors. Keys cached before the switch are stale:
            `decoding.make_generator` runs the sequence again when it first passes L, as
            transformers' Phi-3 `generate` does, so each step's logits are the full forward's.
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
  factor between low_freq_factor and high_freq_factor over original_max positions), 'yarn'
  (NTK-by-parts between beta_fast and beta_slow rotations, cos and sin times attn_factor; 0 means
  YaRN's 0.1 ln(factor) + 1), 'dynamic' (NTK: theta grows with the call's length past
  original_max) or 'longrope' (Phi-3: per-frequency short_factor up to original_max, long_factor
  past it, cos and sin times attn_factor; 0 means sqrt(1 + ln(factor) / ln(original_max))).
  original_max, the pretraining context L, is the model's context where a checkpoint states none
  (`GPT.rope_spec` resolves it; transformers' default). partial: the fraction of each head's
  features rotated (R = int(K partial), transformers' partial_rotary_factor)."""

  theta: float = 10000.0
  scaling: str = "none"
  factor: float = 1.0
  original_max: int = 0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attn_factor: float = 0.0
  partial: float = 1.0
  short_factor: tuple[float, ...] = ()
  long_factor: tuple[float, ...] = ()

  @property
  def follows_length(self) -> bool:
    """Whether the frequencies depend on the length a call reaches (module docstring)."""
    return self.scaling in ("dynamic", "longrope")


ROPE_SCALINGS = ("none", "linear", "llama3", "yarn", "dynamic", "longrope")


def rotary_width(rope: RopeSpec, k: int) -> int:
  """R, the rotated features of a K-wide head: int(K partial), as transformers rounds it."""
  return int(k * rope.partial)


def dynamic_inv_freq(rope: RopeSpec, r: int, n):
  """Dynamic NTK's (R/2,) float32 inverse frequencies at length n (an int or a traced scalar),
  in transformers' float32 order of operations: n' = max(n, L),
  theta' = theta (s n' / L - (s - 1))^(R / (R - 2)), w_i = 1 / theta'^(2i / R)."""
  big_l, s = rope.original_max, rope.factor
  n = jnp.maximum(jnp.asarray(n, jnp.int32), big_l).astype(jnp.float32)
  base = jnp.float32(rope.theta) * ((jnp.float32(s) * n / big_l - jnp.float32(s - 1))
                                    ** jnp.float32(r / (r - 2)))
  return 1.0 / base ** (jnp.arange(0, r, 2, dtype=jnp.float32) / r)


def rope_frequencies(rope: RopeSpec, k: int, seq_len: int | None = None
                     ) -> tuple[np.ndarray, float]:
  """(inv_freq (R/2,) float32, attention scaling): feature pair i turns by pos * inv_freq[i], and
  cos, sin are multiplied by the scaling. As transformers' ROPE_INIT_FUNCTIONS compute them
  (in float64 here, rounded once; dynamic in float32 as transformers), with w_i = theta^(-2i/R)
  and factor s; seq_len is the length a call reaches (dynamic and longrope follow it; None: at
  most L):
    none      w_i, 1
    linear    w_i / s, 1
    llama3    with L = original_max and wavelength l_i = 2 pi / w_i: w_i where l_i < L / high,
              w_i / s where l_i > L / low, else (1 - a) w_i / s + a w_i, a = (L / l_i - low) /
              (high - low); scaling 1
    yarn      with d(r) = R ln(L / (2 pi r)) / (2 ln theta), the band lo = max(floor(d(beta_fast)),
              0), hi = min(ceil(d(beta_slow)), R - 1), ramp_i = clip((i - lo) / (hi - lo), 0, 1):
              w_i (1 - ramp_i) + (w_i / s) ramp_i, scaling attn_factor or 0.1 ln(s) + 1 (1 if
              s <= 1)
    dynamic   `dynamic_inv_freq` at seq_len, 1
    longrope  w_i / short_i (seq_len <= L) or w_i / long_i (seq_len > L), scaling attn_factor or
              sqrt(1 + ln(s) / ln(L)) (1 if s <= 1)
  """
  r = rotary_width(rope, k)
  if r % 2 or r <= 0:
    raise ValueError(f"rope needs an even number of rotated features, got {r} (head width {k}, "
                     f"partial {rope.partial})")
  if rope.scaling not in ROPE_SCALINGS:
    raise ValueError(f"rope scaling: unknown {rope.scaling!r}; expected one of {ROPE_SCALINGS}")
  w = 1.0 / rope.theta ** (np.arange(0, r, 2, dtype=np.float64) / r)
  s, big_l, scale = rope.factor, rope.original_max, 1.0
  if rope.scaling not in ("none", "linear") and big_l <= 0:
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
    dim = lambda q: r * math.log(big_l / (q * 2 * math.pi)) / (2 * math.log(rope.theta))  # noqa: E731
    lo, hi = max(math.floor(dim(rope.beta_fast)), 0), min(math.ceil(dim(rope.beta_slow)), r - 1)
    hi = hi + 0.001 if lo == hi else hi  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(r // 2) - lo) / (hi - lo), 0, 1)
    w = w * (1 - ramp) + (w / s) * ramp
    scale = rope.attn_factor or (0.1 * math.log(s) + 1.0 if s > 1 else 1.0)
  elif rope.scaling == "dynamic":
    w = np.asarray(dynamic_inv_freq(rope, r, seq_len or 0), np.float64)
  elif rope.scaling == "longrope":
    ext = rope.long_factor if seq_len and seq_len > big_l else rope.short_factor
    if len(ext) != r // 2:
      raise ValueError(f"longrope needs {r // 2} factors (one per rotated pair), got {len(ext)}")
    w = w / np.asarray(ext, np.float64)
    scale = rope.attn_factor or (math.sqrt(1 + math.log(s) / math.log(big_l)) if s > 1 else 1.0)
  return w.astype(np.float32), float(scale)


def frequencies_at(rope: RopeSpec, k: int, positions):
  """(inv_freq (R/2,), scaling) of a call at `positions`: where the frequencies follow the
  length, those of n = the largest position + 1 (module docstring; traced or not), else
  `rope_frequencies`'."""
  if not rope.follows_length:
    inv_freq, scale = rope_frequencies(rope, k)
    return jnp.asarray(inv_freq), scale
  n = jnp.max(positions) + 1
  if rope.scaling == "dynamic":
    return dynamic_inv_freq(rope, rotary_width(rope, k), n), 1.0
  (short, scale), (long, _) = (rope_frequencies(rope, k),
                               rope_frequencies(rope, k, rope.original_max + 1))
  return jnp.where(n > rope.original_max, jnp.asarray(long), jnp.asarray(short)), scale


def apply_rope(x_BxTxHxK, positions_T, rope: float | RopeSpec = 10000.0):
  """Rotary position embedding: rotates feature pairs (i, i + R/2) of the first R features by
  angle pos * inv_freq[i] (`frequencies_at` the call's positions of `rope`, a RopeSpec or plain
  RoPE's base theta: base^(-2i/K)), the rotated features times the spec's attention scaling;
  the K - R others pass (`rotate`).

  `positions_T` is (T,) shared by the batch, or (B, T) per row (packed documents, left padding).
  Where the frequencies follow the length, the call's is the largest position + 1."""
  rope = rope if isinstance(rope, RopeSpec) else RopeSpec(theta=float(rope))
  inv_freq, scale = frequencies_at(rope, x_BxTxHxK.shape[-1], positions_T)
  return rotate(x_BxTxHxK, positions_T, inv_freq, scale)


def rotate(x_BxTxHxK, positions_T, inv_freq_R2, scale=1.0):
  """`apply_rope` from the frequencies themselves (they and the cos/sin scaling may be traced):
  R = 2 len(inv_freq) features rotate, the K - R after them pass."""
  ang_TxR2 = positions_T.astype(jnp.float32)[..., None] * inv_freq_R2.astype(jnp.float32)
  # (..., T, 1, R/2): broadcasts over the heads, and over the batch when positions are (T,).
  cos, sin = jnp.cos(ang_TxR2)[..., None, :], jnp.sin(ang_TxR2)[..., None, :]
  if not (isinstance(scale, float) and scale == 1.0):
    cos, sin = cos * scale, sin * scale
  x, r = x_BxTxHxK.astype(jnp.float32), 2 * inv_freq_R2.shape[-1]
  x1, x2, rest = x[..., :r // 2], x[..., r // 2:r], x[..., r:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
  return out.astype(x_BxTxHxK.dtype)
