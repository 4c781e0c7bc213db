"""Image augmentation as a grain transform, every random number derived from the record.

Shapes: G global batch rows, B this process's rows, N records, H x W x C images, K classes.

Randomness. Record r (its row in the training split) in epoch e draws the uniforms

    u_j(r) = mix(mix(mix(mix(seed) ^ e) ^ r) ^ j) / 2^64 (top 53 bits),   j = 0 .. SLOTS - 1,

with mix the splitmix64 step (state += 0x9E3779B97F4A7C15, then the two xor-shift-multiplies).
Nothing is carried from batch to batch, so the augmented batch of step s depends only on (seed,
s): a resumed iterator, restored at step s, draws exactly the augmentations of an uninterrupted
one, whatever the process count.

Ops (`data.augment`, a tuple of 'name' or 'name=value'; applied in this order, whatever the
order listed; uniforms by slot j):
  crop[=P]        pad P zero pixels (default 4) on each side, crop an H x W window at
                  (dy, dx) = floor(u_{0,1} (2P + 1)): a shift by (dy - P, dx - P) pixels
  flip            mirror left-right when u_2 < 1/2 (not for digits or text: a mirrored 2, 3, 7 is
                  no digit)
  jitter[=s]      RGB only (C = 3), with b, c, a = 1 + s (2 u_{3,4,5} - 1) (default s = 0.4):
                  brightness x <- b x; contrast x <- m + c (x - m), m the image's mean grey level;
                  saturation x <- g + a (x - g), g = 0.299 R + 0.587 G + 0.114 B per pixel
  mixup[=alpha]   x <- lam x + (1 - lam) x', q <- lam onehot(y) + (1 - lam) onehot(y'),
                  lam = F^-1(u_7) for F the Beta(alpha, alpha) CDF (default alpha 0.2)
  cutmix[=alpha]  the box of sides floor(H sqrt(1 - lam)) x floor(W sqrt(1 - lam)) centred at
                  (floor(u_8 H), floor(u_9 W)), clipped to the image, comes from x';
                  q <- lam' onehot(y) + (1 - lam') onehot(y'), lam' = 1 - box area / (H W)
                  (default alpha 1.0); with mixup also listed a record mixes when u_6 < 1/2

The partner x' of global batch position g is position G - 1 - g of the same global batch (its
record-level ops drawn from its own record), gathered by this process itself, so pairs do not
depend on how the batch is split over processes. With mixup or cutmix the batch's 'y' becomes
soft targets q (B, K) float32, which the classification task takes as they are. Only the
training stream is augmented; evaluation batches never are.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import grain
import numpy as np

from jaxdl.schema import Check, setting

SLOTS = 10
DEFAULTS = {"crop": 4.0, "flip": None, "jitter": 0.4, "mixup": 0.2, "cutmix": 1.0}
ORDER = tuple(DEFAULTS)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_GREY_C = np.array([0.299, 0.587, 0.114], np.float32)


def splitmix64(z: np.ndarray) -> np.ndarray:
  """One splitmix64 step of the uint64 state z: the output for state z + gamma."""
  with np.errstate(over="ignore"):  # arithmetic mod 2^64 is the point
    z = np.asarray(z, np.uint64) + _GAMMA
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def record_uniforms(seed: int, epoch: int, rows_B: np.ndarray, slots: int = SLOTS) -> np.ndarray:
  """u (B, slots) in [0, 1): the uniforms of records rows_B in epoch `epoch` (module docstring)."""
  h = splitmix64(splitmix64(np.array([seed % 2**64], np.uint64)) ^ np.uint64(epoch))
  h_B = splitmix64(h ^ np.asarray(rows_B, np.uint64))
  h_BxJ = splitmix64(h_B[:, None] ^ np.arange(slots, dtype=np.uint64)[None, :])
  return (h_BxJ >> np.uint64(11)).astype(np.float64) * 2.0**-53


def parse_ops(spec) -> dict[str, float | None]:
  """('crop=1', 'flip') -> {'crop': 1.0, 'flip': None}; ValueError (one line) on a bad op."""
  ops = {}
  for item in spec:
    name, has_value, text = str(item).partition("=")
    if name not in DEFAULTS:
      raise ValueError(f"unknown op {item!r}; expected some of {', '.join(ORDER)} (as 'name' or "
                       f"'name=value')")
    if name in ops:
      raise ValueError(f"op {name!r} is listed twice")
    if has_value and DEFAULTS[name] is None:
      raise ValueError(f"op {name!r} takes no value, got {item!r}")
    try:
      value = float(text) if has_value else DEFAULTS[name]
    except ValueError:
      raise ValueError(f"op {name!r}: expected a number after '=', got {text!r}") from None
    ok = {"crop": lambda v: v >= 0 and v == int(v), "jitter": lambda v: 0 <= v < 1,
          "mixup": lambda v: v > 0, "cutmix": lambda v: v > 0}.get(name, lambda v: True)
    if value is not None and not ok(value):
      need = {"crop": "a whole number of pixels >= 0", "jitter": "a strength in [0, 1)"}
      raise ValueError(f"op {name!r}: expected {need.get(name, 'alpha > 0')}, got {text!r}")
    ops[name] = value
  return ops


def augment_problem(spec) -> str | None:
  """None when every op of a `data.augment` spec parses, else the message."""
  try:
    parse_ops(spec)
  except ValueError as e:
    return str(e)
  return None


def augment_setting():
  """The `augment` field of an image source: `augment: tuple = augment_setting()`."""
  return setting((), Check(lambda v: augment_problem(v) is None, augment_problem))


def crop(x_BxHxWxC: np.ndarray, u_Bx2: np.ndarray, pad: int) -> np.ndarray:
  """Zero-pads `pad` pixels and takes the H x W window at (dy, dx) = floor(u (2 pad + 1))."""
  b, h, w, _ = x_BxHxWxC.shape
  x_pad = np.pad(x_BxHxWxC, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  d_Bx2 = np.minimum((u_Bx2 * (2 * pad + 1)).astype(np.int64), 2 * pad)
  iy_BxH = d_Bx2[:, :1] + np.arange(h)
  ix_BxW = d_Bx2[:, 1:] + np.arange(w)
  return x_pad[np.arange(b)[:, None, None], iy_BxH[:, :, None], ix_BxW[:, None, :]]


def flip(x_BxHxWxC: np.ndarray, u_B: np.ndarray) -> np.ndarray:
  """Mirrors left-right the images with u < 1/2."""
  return np.where((u_B < 0.5)[:, None, None, None], x_BxHxWxC[:, :, ::-1], x_BxHxWxC)


def jitter(x_BxHxWx3: np.ndarray, u_Bx3: np.ndarray, strength: float) -> np.ndarray:
  """Brightness, contrast and saturation factors 1 + s (2 u - 1), in that order."""
  f_Bx3 = (1.0 + strength * (2.0 * u_Bx3 - 1.0)).astype(np.float32)
  b, c, a = (f_Bx3[:, i, None, None, None] for i in range(3))
  x = x_BxHxWx3 * b
  m = (x @ _GREY_C).mean(axis=(1, 2))[:, None, None, None]
  x = m + c * (x - m)
  g = (x @ _GREY_C)[..., None]
  return (g + a * (x - g)).astype(x_BxHxWx3.dtype)


def beta_quantile(u: np.ndarray, alpha: float) -> np.ndarray:
  """lam = F^-1(u) for the Beta(alpha, alpha) distribution."""
  from scipy.special import betaincinv  # pylint: disable=g-import-not-at-top
  return betaincinv(alpha, alpha, u)


def cutmix_mask(u_Bx2: np.ndarray, lam_B: np.ndarray, h: int, w: int) -> np.ndarray:
  """(B, H, W) bool: the box taken from the partner (module docstring)."""
  r_B = np.sqrt(1.0 - lam_B)
  ch_B, cw_B = (h * r_B).astype(np.int64), (w * r_B).astype(np.int64)
  cy_B, cx_B = (u_Bx2[:, 0] * h).astype(np.int64), (u_Bx2[:, 1] * w).astype(np.int64)
  y0_B, x0_B = cy_B - ch_B // 2, cx_B - cw_B // 2
  iy, ix = np.arange(h)[None, :, None], np.arange(w)[None, None, :]
  inside_y = (iy >= y0_B[:, None, None]) & (iy < (y0_B + ch_B)[:, None, None])
  inside_x = (ix >= x0_B[:, None, None]) & (ix < (x0_B + cw_B)[:, None, None])
  return inside_y & inside_x


def mix(x_a: np.ndarray, y_a: np.ndarray, x_b: np.ndarray, y_b: np.ndarray, u_BxJ: np.ndarray,
        ops: dict, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """Mixup / cutmix of each record with its partner: (x, soft targets q (B, K) float32)."""
  b, h, w, _ = x_a.shape
  use_cut_B = np.full(b, "cutmix" in ops)
  if "mixup" in ops and "cutmix" in ops:
    use_cut_B = u_BxJ[:, 6] >= 0.5
  lam_mix_B = beta_quantile(u_BxJ[:, 7], ops.get("mixup") or 1.0)
  lam_cut_B = beta_quantile(u_BxJ[:, 7], ops.get("cutmix") or 1.0)
  box_BxHxW = cutmix_mask(u_BxJ[:, 8:10], lam_cut_B, h, w) & use_cut_B[:, None, None]
  lam_B = np.where(use_cut_B, 1.0 - box_BxHxW.mean(axis=(1, 2)), lam_mix_B)
  lam_x = np.where(use_cut_B, 1.0, lam_B)[:, None, None, None]
  x = np.where(box_BxHxW[..., None], x_b, lam_x * x_a + (1.0 - lam_x) * x_b)
  eye = np.eye(num_classes, dtype=np.float32)
  q_BxK = lam_B[:, None] * eye[y_a] + (1.0 - lam_B[:, None]) * eye[y_b]
  return x.astype(x_a.dtype), q_BxK.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """The parsed ops of a training stream, its seed and the number of classes."""
  ops: dict
  seed: int
  num_classes: int

  @property
  def mixes(self) -> bool:
    return "mixup" in self.ops or "cutmix" in self.ops

  def records(self, batch: dict, epoch: int, rows_B: np.ndarray) -> tuple[dict, np.ndarray]:
    """The record-level ops (crop, flip, jitter) of rows_B; returns the batch and its uniforms."""
    u_BxJ = record_uniforms(self.seed, epoch, rows_B)
    x = batch["x"]
    if "crop" in self.ops:
      x = crop(x, u_BxJ[:, 0:2], int(self.ops["crop"]))
    if "flip" in self.ops:
      x = flip(x, u_BxJ[:, 2])
    if "jitter" in self.ops:
      x = jitter(x, u_BxJ[:, 3:6], self.ops["jitter"])
    return {**batch, "x": x}, u_BxJ

  def transform(self, gather: Callable, lo: int, hi: int) -> "AugmentBatch":
    return AugmentBatch(self, gather, lo, hi)


class AugmentBatch(grain.transforms.Map):
  """(epoch, global rows_G) -> this process's rows [lo, hi) gathered and augmented."""

  def __init__(self, aug: Augmentation, gather: Callable, lo: int, hi: int):
    self.aug, self.gather, self.lo, self.hi = aug, gather, lo, hi

  def map(self, element):
    epoch, rows_G = element
    rows_B = rows_G[self.lo:self.hi]
    batch, u_BxJ = self.aug.records(self.gather(rows_B), epoch, rows_B)
    if not self.aug.mixes:
      return batch
    partner_rows_B = rows_G[::-1][self.lo:self.hi]   # global position g pairs with G - 1 - g
    partner, _ = self.aug.records(self.gather(partner_rows_B), epoch, partner_rows_B)
    x, q_BxK = mix(batch["x"], batch["y"], partner["x"], partner["y"], u_BxJ, self.aug.ops,
                   self.aug.num_classes)
    return {**batch, "x": x, "y": q_BxK}


def augmentation(spec, info: dict, seed: int) -> Augmentation | None:
  """The checked `data.augment` of a built source (None when empty): image classification only,
  jitter for 3 channels only."""
  ops = parse_ops(spec)
  if not ops:
    return None
  shape = tuple(info.get("input_shape", ()))
  if info.get("kind") != "classification" or len(shape) != 3:
    raise ValueError(f"data.augment: needs images (H, W, C) of a classification dataset, got "
                     f"kind {info.get('kind')!r} with input shape {shape}")
  if "jitter" in ops and shape[2] != 3:
    raise ValueError(f"data.augment: 'jitter' is colour jitter for RGB images (C = 3), got "
                     f"C = {shape[2]}")
  return Augmentation(ops, seed, int(info["num_classes"]))
