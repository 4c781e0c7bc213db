"""Attention over a sequence split across devices: a ring of key/value blocks, or all of them
gathered (`parallel.sequence`, `jaxdl.train.mesh`).

Shapes: B batch, T sequence, S devices on the 'sequence' mesh axis, C = T / S the positions a
device holds, c = T / (2 S) a chunk, H query heads, N key/value heads, G = H / N, K head width,
D model width.

Layout (causal load balancing). T is cut into 2 S chunks of c positions; device d holds chunks
d and 2 S - 1 - d, so under a causal mask every device has as many keys to read as any other
(chunk d is early, its mirror late). `to_layout` permutes a (B, T, ...) array into that order
(the devices' C-position slices then follow each other), `from_layout` back, and
`layout_index(T, S)` lists the original positions in layout order. The GPT permutes its tokens,
positions and segment ids once at the input and its final hidden states back before the head
(`enter`, `leave`), so everything outside attention is per position and never knows the order.

Attention (`sequence_attention`, inside `jax.shard_map` over the whole mesh: queries, keys and
values split by batch over the batch axes, by position over 'sequence', by head over 'tensor'
when the heads are split). A key j is visible to query i iff (by original positions)
  causal  j <= i;   window W > 0  i - j < W (|i - j| < W without causality; with `local`, a
  layer's traced bool, only where it is true);   packed documents  segment_ids[j] = segment_ids[i],
so RoPE positions and document boundaries are right across chunk and device boundaries.
Per query row an online softmax over blocks of keys (m the running max, l the running sum,
o the running weighted sum of values; a block's scores s_j = q . k_j times `scale` (None:
1 / sqrt(K)), then c tanh(s_j / c) with a `softcap` c > 0; masked ones left out):
  m' = max(m, max_j s_j),  l' = l e^(m - m') + sum_j e^(s_j - m'),
  o' = o e^(m - m') + sum_j e^(s_j - m') v_j,          out = o / l.
  ring       in step r = 0 .. S-1 device d holds the keys, values and segment ids of device
             e = (d - r) mod S and passes them on to d + 1 (`jax.lax.ppermute`). Under a causal
             mask only the c x c blocks that are not fully masked are computed (q_lo, q_hi: the
             query chunks d and 2S-1-d; kv_lo, kv_hi: the key chunks e and 2S-1-e):
               e = d  q_lo x kv_lo (its diagonal) and q_hi x [kv_lo kv_hi]: 3 blocks
               e < d  [q_lo q_hi] x kv_lo (kv_hi, chunk 2S-1-e > 2S-1-d, is all future): 2 blocks
               e > d  q_hi x [kv_lo kv_hi] (q_lo, chunk d < e, sees neither): 2 blocks
             so every device computes 2 S + 1 blocks where non-causal attention computes 4 S:
             (2 S + 1) / 4 S, about half (`count_blocks=True` returns the count per device)
  allgather  the keys, values and segment ids gathered over 'sequence' (`all_gather`); the
             queries read all T keys at once (C x T scores, nothing skipped)
Each block runs under `jax.checkpoint`: the backward pass keeps a block's inputs, not its
C x c probabilities. Exact up to the order of floating-point sums.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class SequenceSpec:
  """How a GPT's sequence is split (built by the mesh strategy, a model's runtime field): the
  `mesh`, its `batch_axes` (rows), its `axis` (positions, S devices), its `head_axis` ('tensor'
  when the heads are split, else None) and the attention `impl` ('ring' or 'allgather')."""
  mesh: Mesh
  batch_axes: tuple[str, ...]
  axis: str = "sequence"
  head_axis: str | None = None
  impl: str = "ring"

  @property
  def size(self) -> int:
    return self.mesh.shape[self.axis]

  def batch_spec(self, b: int):
    """The rows' axes, or None (rows replicated) for a batch they do not divide (an init's
    single row)."""
    shards = math.prod(self.mesh.shape[a] for a in self.batch_axes)
    return self.batch_axes if b % shards == 0 else None


def layout_index(t: int, s: int) -> np.ndarray:
  """(T,) the original position of each slot of the layout (module docstring)."""
  c = t // (2 * s)
  chunks = np.arange(2 * s).reshape(2, s)
  order = np.stack([chunks[0], chunks[1][::-1]], axis=1).reshape(-1)  # 0, 2S-1, 1, 2S-2, ...
  return (order[:, None] * c + np.arange(c)).reshape(-1)


def to_layout(x_BxT, s: int):
  """x (B, T, ...) permuted so device d's C slots hold chunks d and 2 S - 1 - d."""
  b, t = x_BxT.shape[:2]
  rest = x_BxT.shape[2:]
  x = x_BxT.reshape(b, 2, s, t // (2 * s), *rest)
  lo, hi = x[:, 0], jnp.flip(x[:, 1], axis=1)  # chunks 0..S-1 and 2S-1..S
  return jnp.stack([lo, hi], axis=2).reshape(b, t, *rest)


def from_layout(x_BxT, s: int):
  """The inverse of `to_layout`."""
  b, t = x_BxT.shape[:2]
  rest = x_BxT.shape[2:]
  x = x_BxT.reshape(b, s, 2, t // (2 * s), *rest)
  lo, hi = x[:, :, 0], jnp.flip(x[:, :, 1], axis=1)
  return jnp.stack([lo, hi], axis=1).reshape(b, t, *rest)


def constrain(x_BxTx, spec: SequenceSpec, trailing=None):
  """x split by rows over the batch axes and by position over 'sequence'; its other dimensions
  `trailing` (None: whole; P.UNCONSTRAINED: as the partitioner likes, e.g. the logits' vocab)."""
  parts = (spec.batch_spec(x_BxTx.shape[0]), spec.axis) + (trailing,) * (x_BxTx.ndim - 2)
  return jax.lax.with_sharding_constraint(x_BxTx, NamedSharding(spec.mesh, P(*parts)))


def enter(spec: SequenceSpec, x_BxT, positions, segment_ids, pos=0):
  """The GPT's inputs in the layout, split over 'sequence': tokens, positions (pos + 0..T-1
  when None: the layout needs them explicit) and segment ids (when given)."""
  b, t = x_BxT.shape
  if t % (2 * spec.size):
    raise ValueError(f"GPT: parallel.sequence={spec.size} splits a sequence into "
                     f"{2 * spec.size} chunks, which do not divide its {t} positions")
  if positions is None:
    positions = jnp.broadcast_to(pos + jnp.arange(t), (b, t))
  moved = [None if a is None else constrain(to_layout(a, spec.size), spec)
           for a in (x_BxT, positions, segment_ids)]
  return tuple(moved)


def leave(spec: SequenceSpec, x_BxTxD):
  """The final hidden states back in position order, still split over 'sequence'."""
  return constrain(from_layout(x_BxTxD, spec.size), spec)


# ---------------------------------------------------------------------------------------------
# The per-device computation.


def _visible(q_idx, k_idx, q_seg, k_seg, local, causal: bool, window: int):
  """Bool (B or 1, 1, 1, Q, S'): key j visible to query i (module docstring)."""
  qi, kj = q_idx[:, None], k_idx[None, :]
  ok = jnp.ones(qi.shape[:1] + kj.shape[1:], bool)
  if causal:
    ok = kj <= qi
  if window:
    band = (qi - kj < window) if causal else (jnp.abs(qi - kj) < window)
    ok = ok & (band if local is None else band | ~local)
  ok = ok[None, None, None]
  if q_seg is not None:
    ok = ok & (q_seg[:, :, None] == k_seg[:, None, :])[:, None, None]
  return ok


def _block(q_BxQxNxGxK, k_BxSxNxK, v_BxSxNxK, q_idx, k_idx, q_seg, k_seg, local, *, causal,
           window, scale, softcap):
  """One block's (o BxQxNxGxK, m BxNxGxQ, l BxNxGxQ) in fp32 (module docstring)."""
  scale = 1.0 / math.sqrt(q_BxQxNxGxK.shape[-1]) if scale is None else scale
  s = jnp.einsum("bqngk,bsnk->bngqs", q_BxQxNxGxK, k_BxSxNxK,
                 preferred_element_type=jnp.float32) * scale
  if softcap:
    s = softcap * jnp.tanh(s / softcap)
  ok = _visible(q_idx, k_idx, q_seg, k_seg, local, causal, window)
  m = jnp.max(jnp.where(ok, s, -jnp.inf), axis=-1)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.where(ok, jnp.exp(s - m_safe[..., None]), 0.0)
  o = jnp.einsum("bngqs,bsnk->bqngk", p.astype(v_BxSxNxK.dtype), v_BxSxNxK,
                 preferred_element_type=jnp.float32)
  return o, m, jnp.sum(p, axis=-1)


def _merge(acc, part):
  """Two online-softmax partials of the same rows as one."""
  (o1, m1, l1), (o2, m2, l2) = acc, part
  m = jnp.maximum(m1, m2)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  a1, a2 = jnp.exp(m1 - m_safe), jnp.exp(m2 - m_safe)
  rows = lambda a: jnp.moveaxis(a, 3, 1)[..., None]  # noqa: E731  BxNxGxQ -> BxQxNxGx1
  return o1 * rows(a1) + o2 * rows(a2), m, l1 * a1 + l2 * a2


def _empty(b, q, n, g, k):
  return (jnp.zeros((b, q, n, g, k), jnp.float32), jnp.full((b, n, g, q), -jnp.inf),
          jnp.zeros((b, n, g, q), jnp.float32))


def _rows(acc, lo, hi):
  o, m, total = acc
  return o[:, lo:hi], m[..., lo:hi], total[..., lo:hi]


def _join(a, b):
  return (jnp.concatenate([a[0], b[0]], 1), jnp.concatenate([a[1], b[1]], -1),
          jnp.concatenate([a[2], b[2]], -1))


def _local_attention(q, k, v, seg, local, *, spec: SequenceSpec, causal: bool, window: int,
                     scale, softcap):
  """One device's attention (inside shard_map): out BxCxHxK and its block count (1,)."""
  s_, axis = spec.size, spec.axis
  b, cq, h, kk = q.shape
  n = k.shape[2]
  c = cq // 2
  q5 = q.reshape(b, cq, n, h // n, kk)
  d = jax.lax.axis_index(axis)
  idx = lambda e: jnp.concatenate([e * c + jnp.arange(c), (2 * s_ - 1 - e) * c + jnp.arange(c)])  # noqa: E731
  q_idx = idx(d)
  block = jax.checkpoint(lambda *a: _block(*a, local, causal=causal, window=window, scale=scale,
                                           softcap=softcap))
  if spec.impl == "allgather":
    gather = lambda a: jax.lax.all_gather(a, axis, axis=1, tiled=True)  # noqa: E731
    k_all, v_all = gather(k), gather(v)
    seg_all = None if seg is None else gather(seg)
    k_idx = jnp.asarray(layout_index(cq * s_, s_))
    acc = block(q5, k_all, v_all, q_idx, k_idx, seg, seg_all)
    count = 4 * s_
  else:
    acc, count = _ring(q5, k, v, seg, block, idx, d, spec, causal)
  o, _, total = acc
  total = jnp.moveaxis(total, 3, 1)  # BxNxGxC -> BxCxNxG
  out = o / jnp.where(total > 0, total, 1.0)[..., None]
  return out.reshape(b, cq, h, kk).astype(q.dtype), jnp.reshape(count, (1,))


def _ring(q5, k, v, seg, block, idx, d, spec: SequenceSpec, causal: bool):
  """The ring's accumulated (o, m, l) and the c x c blocks this device computed."""
  s_ = spec.size
  b, cq, n, g, kk = q5.shape
  c = cq // 2
  q_idx = idx(d)
  sl = lambda a, lo, hi: None if a is None else a[:, lo:hi]  # noqa: E731
  acc_lo, acc_hi = _empty(b, c, n, g, kk), _empty(b, c, n, g, kk)
  count = jnp.int32(0)
  kv = (k, v, seg)
  for r in range(s_):
    if r:  # device j's blocks move on to j + 1
      kv = jax.lax.ppermute(kv, spec.axis, [(j, (j + 1) % s_) for j in range(s_)])
    k_, v_, kseg = kv
    e = (d - r) % s_
    k_idx = idx(e)
    if not causal:
      part = block(q5, k_, v_, q_idx, k_idx, seg, kseg)
      acc_lo, acc_hi = _merge(acc_lo, _rows(part, 0, c)), _merge(acc_hi, _rows(part, c, cq))
      count += 4
      continue

    def hi_all(a_lo, a_hi, k_=k_, v_=v_, k_idx=k_idx, kseg=kseg):  # q_hi x [kv_lo kv_hi]
      part = block(q5[:, c:], k_, v_, q_idx[c:], k_idx, sl(seg, c, cq), kseg)
      return a_lo, _merge(a_hi, part)

    if r == 0:  # e = d: q_lo x kv_lo on the diagonal, then q_hi x everything
      part = block(q5[:, :c], k_[:, :c], v_[:, :c], q_idx[:c], k_idx[:c], sl(seg, 0, c),
                   sl(kseg, 0, c))
      acc_lo = _merge(acc_lo, part)
      acc_lo, acc_hi = hi_all(acc_lo, acc_hi)
      count += 3
      continue

    def all_lo(a_lo, a_hi, k_=k_, v_=v_, k_idx=k_idx, kseg=kseg):  # [q_lo q_hi] x kv_lo
      part = block(q5, k_[:, :c], v_[:, :c], q_idx, k_idx[:c], seg, sl(kseg, 0, c))
      return _merge(a_lo, _rows(part, 0, c)), _merge(a_hi, _rows(part, c, cq))

    acc_lo, acc_hi = jax.lax.cond(e < d, all_lo, hi_all, acc_lo, acc_hi)
    count += 2
  return _join(acc_lo, acc_hi), count


def sequence_attention(q_BxTxHxK, k_BxTxNxK, v_BxTxNxK, spec: SequenceSpec, *,
                       segment_ids=None, causal: bool = True, window: int = 0, local=None,
                       scale=None, softcap: float = 0.0, count_blocks: bool = False):
  """softmax(Q K^T / sqrt(K) + mask) V over a sequence in the layout, split over spec.axis
  (module docstring): out BxTxHxK, and with `count_blocks` also the c x c blocks each device
  computed, (S,) int32. `segment_ids` (B, T) keep packed documents apart; `local` (a traced
  bool, None: always) says whether the window applies; `scale` replaces 1 / sqrt(K), `softcap`
  c > 0 caps the scaled logits at c tanh(z / c)."""
  b = q_BxTxHxK.shape[0]
  rows = spec.batch_spec(b)
  qkv = P(rows, spec.axis, spec.head_axis, None)
  seg_spec = P(rows, spec.axis)

  packed, windowed = segment_ids is not None, local is not None and window > 0
  args, specs = ((segment_ids,), (seg_spec,)) if packed else ((), ())
  if windowed:  # a traced bool, the same on every device
    args, specs = args + (jnp.asarray(local, bool),), specs + (P(),)

  def per_device(q, k, v, *more):
    seg = more[0] if packed else None
    return _local_attention(q, k, v, seg, more[-1] if windowed else None, spec=spec,
                            causal=causal, window=window, scale=scale, softcap=softcap)

  fn = jax.shard_map(per_device, mesh=spec.mesh, in_specs=(qkv, qkv, qkv) + specs,
                     out_specs=(qkv, P(spec.axis)), check_vma=False)
  out, count = fn(q_BxTxHxK, k_BxTxNxK, v_BxTxNxK, *args)
  return (out, count) if count_blocks else out
