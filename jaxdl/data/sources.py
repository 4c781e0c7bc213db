"""Embedded and user datasets as in-memory arrays; nothing is downloaded.

Each dataset is a registered `DataSource` dataclass (`jaxdl.data.registry`): its fields are its
config keys with their defaults and checks, and `build()` returns a `Source`: a train `Split`,
an eval `Split` and the `info` dict. A `Split` knows its size and gathers a batch of examples
from an index array, so the pipeline only ever moves small integer indices around (the iterator
state stays tiny).

Shapes: N examples, B batch rows, T context length, D feature dims.

Datasets:
  moons     sklearn make_moons: train = the exact draw (n, noise, random_state=data_seed),
            eval = an independent draw with random_state data_seed + 1.        kind 'binary'
  digits    sklearn load_digits, x = pixels / 16 in [0, 1] (or 2 x - 1 in [-1, 1] with
            scale 'symmetric'), stratified 80/20 split, random_state 0 (n_train: the first n
            training rows only); `augment` ops on the training stream.        kind 'classification'
  toy2d     2-D generative targets (moons, 8gaussians, checkerboard, swissroll), independent
            samples (toy moons are not make_moons' stratified draw), each mapped by a fixed
            affine so every coordinate has mean ~0 and std ~1.                 kind 'generative'
  text      bytes of the Python standard library's .py files (sorted, capped at max_bytes),
            split by file: crc32(relative path) decides train or val.          kind 'lm'
  textfile  a user text file, the last val_frac of its bytes held out.         kind 'lm'
  npz       user arrays x, y (optional x_eval, y_eval, else a seeded eval_frac holdout).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sysconfig
import zlib

import numpy as np

from jaxdl.data.augment import augment_setting
from jaxdl.data.embedded_cache import sklearn_arrays
from jaxdl.schema import NONNEG, OPEN_UNIT, POSITIVE, one_of, setting
from jaxdl.data.registry import DataSource, Source, Split, register_source

KINDS = ("classification", "binary", "lm", "regression", "generative")
TOY2D = ("moons", "8gaussians", "checkerboard", "swissroll")


def _array_split(arrays: dict[str, np.ndarray]) -> Split:
  num = len(next(iter(arrays.values())))
  return Split(num, lambda idx_B: {k: v[idx_B] for k, v in arrays.items()})


def _info(kind, train, eval_, input_shape, num_classes=None, vocab_size=None):
  return dict(kind=kind, num_classes=num_classes, vocab_size=vocab_size,
              input_shape=tuple(int(s) for s in input_shape), num_train=train.num,
              num_eval=eval_.num)


def arrays_source(kind: str, train: dict[str, np.ndarray], eval_: dict[str, np.ndarray],
                  num_classes: int | None = None, vocab_size: int | None = None) -> Source:
  """A `Source` over in-memory arrays: `train` / `eval_` map 'x' (N, ...) and optional 'y' (N,)
  to arrays with N rows each; info's input_shape is x's shape without N, `kind` one of KINDS."""
  tr, ev = _array_split(train), _array_split(eval_)
  return Source(tr, ev, _info(kind, tr, ev, train["x"].shape[1:], num_classes, vocab_size))


# --- moons ------------------------------------------------------------------------------------

@register_source("moons")
@dataclasses.dataclass(frozen=True)
class Moons(DataSource):
  batch_size: int = 1000                       # the course's full batch
  n: int = setting(1000, POSITIVE)             # training points
  n_eval: int | None = setting(None, POSITIVE)  # None: n
  noise: float = setting(0.25, NONNEG)         # std of the Gaussian added to each point
  data_seed: int = 42                          # train random_state; eval uses data_seed + 1

  def build(self) -> Source:
    n_eval = self.n if self.n_eval is None else self.n_eval

    def draw(n, seed):
      def build():
        from sklearn.datasets import make_moons  # pylint: disable=g-import-not-at-top
        x_NxD, y_N = make_moons(n_samples=n, noise=self.noise, random_state=seed)
        return {"x": x_NxD.astype(np.float32), "y": y_N.astype(np.float32)}
      return sklearn_arrays(f"moons-{n}-{self.noise!r}-{seed}", build)

    return arrays_source("binary", draw(self.n, self.data_seed),
                          draw(n_eval, self.data_seed + 1), num_classes=2)


# --- digits -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """The fixed split: (x_train, y_train, x_test, y_test), x raw pixels 0..16 of shape (N, 8, 8)."""
  def build():
    from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
    from sklearn.model_selection import train_test_split  # pylint: disable=g-import-not-at-top
    d = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        d.images, d.target, test_size=0.2, random_state=0, stratify=d.target)
    return dict(x_tr=x_tr, y_tr=y_tr, x_te=x_te, y_te=y_te)

  a = sklearn_arrays("digits-split", build)
  return a["x_tr"], a["y_tr"], a["x_te"], a["y_te"]


@register_source("digits")
@dataclasses.dataclass(frozen=True)
class Digits(DataSource):
  scale: str = setting("unit", one_of("unit", "symmetric"))  # x in [0, 1] or [-1, 1]
  n_train: int | None = setting(None, POSITIVE)  # None: all 1437; n: the split's first n rows
  augment: tuple = augment_setting()             # training ops (jaxdl.data.augment)

  def build(self) -> Source:
    x_tr, y_tr, x_te, y_te = digits_split()
    x_tr, y_tr = x_tr[:self.n_train], y_tr[:self.n_train]  # the split is already shuffled

    def prep(x_Nx8x8, y_N):
      x = (x_Nx8x8 / 16.0).astype(np.float32)[..., None]
      if self.scale == "symmetric":
        x = 2.0 * x - 1.0  # the diffusion convention: data in [-1, 1]
      return {"x": x, "y": y_N.astype(np.int32)}

    return arrays_source("classification", prep(x_tr, y_tr), prep(x_te, y_te), num_classes=10)


# --- toy 2-D distributions ---------------------------------------------------------------------

# Per-coordinate (mean, std) of each raw distribution, measured on 400k samples and fixed here so
# fresh draws from `sample_toy2d` use exactly the same affine map as the training set.
_TOY2D_AFFINE = {
    "moons": ((0.5, 0.25), (0.872, 0.504)),
    "8gaussians": ((0.0, 0.0), (1.428, 1.428)),
    "checkerboard": ((0.0, 0.0), (1.155, 1.155)),
    "swissroll": ((2.0, 0.196), (6.648, 6.973)),
}


def _toy2d_raw(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
  if name == "moons":
    # make_moons' distribution, drawn independently. make_moons itself puts its points at evenly
    # spaced angles with exactly n/2 per moon: a stratified draw. Two such draws agree far better
    # than independent samples can (the two-draw energy distance at n = 2,000 is 3.2e-4 against
    # 1.9e-3 for independent draws), so no sampler could come near that floor.
    theta_N = rng.uniform(0.0, np.pi, n)
    inner_N = rng.random(n) < 0.5
    x_Nx2 = np.stack([np.where(inner_N, 1.0 - np.cos(theta_N), np.cos(theta_N)),
                      np.where(inner_N, 0.5 - np.sin(theta_N), np.sin(theta_N))], axis=1)
    return x_Nx2 + 0.1 * rng.standard_normal((n, 2))
  if name == "8gaussians":
    # Eight isotropic Gaussians (std 0.2) with centres on a circle of radius 2.
    ang_N = rng.integers(0, 8, n) * (np.pi / 4)
    centre_Nx2 = 2.0 * np.stack([np.cos(ang_N), np.sin(ang_N)], axis=1)
    return centre_Nx2 + 0.2 * rng.standard_normal((n, 2))
  if name == "checkerboard":
    # Uniform on the dark squares of a 4x4 board on [-2, 2]^2.
    x1_N = rng.uniform(-2.0, 2.0, n)
    x2_N = rng.uniform(0.0, 1.0, n) - 2.0 * rng.integers(0, 2, n) + np.floor(x1_N) % 2
    return np.stack([x1_N, x2_N], axis=1)
  if name == "swissroll":
    from sklearn.datasets import make_swiss_roll  # pylint: disable=g-import-not-at-top
    return make_swiss_roll(n, noise=0.5, random_state=int(rng.integers(2**31)))[0][:, [0, 2]]
  raise ValueError(f"data.distribution: unknown 2-D distribution {name!r}; expected one of "
                   f"{', '.join(TOY2D)}")


def sample_toy2d(name: str, n: int, seed: int) -> np.ndarray:
  """`n` fresh samples (float32, shape (n, 2)) of toy distribution `name`, standardized."""
  x_Nx2 = _toy2d_raw(name, int(n), np.random.default_rng(seed))
  mean, std = _TOY2D_AFFINE[name]
  return ((x_Nx2 - np.asarray(mean)) / np.asarray(std)).astype(np.float32)


@register_source("toy2d")
@dataclasses.dataclass(frozen=True)
class Toy2D(DataSource):
  batch_size: int = 256
  distribution: str = setting("moons", one_of(*TOY2D))
  n: int = setting(10_000, POSITIVE)           # training points
  n_eval: int | None = setting(None, POSITIVE)  # None: n
  data_seed: int = 0                           # train seed; eval uses data_seed + 1

  def build(self) -> Source:
    n_eval = self.n if self.n_eval is None else self.n_eval
    train = {"x": sample_toy2d(self.distribution, self.n, self.data_seed)}
    eval_ = {"x": sample_toy2d(self.distribution, n_eval, self.data_seed + 1)}
    return arrays_source("generative", train, eval_)


# --- byte-level text ---------------------------------------------------------------------------

def decode(bytes_array) -> str:
  """Bytes (any int array of values 0..255) -> str, undecodable bytes replaced."""
  return bytes(np.asarray(bytes_array, dtype=np.uint8).reshape(-1).tolist()).decode(
      "utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int, val_frac: float) -> tuple[np.ndarray, np.ndarray]:
  """(train_bytes, val_bytes) as uint8 arrays from the stdlib's .py files.

  Files are taken in sorted relative-path order until `max_bytes` is reached; a file goes to val
  when crc32(relative path) / 2**32 < val_frac, so the split does not depend on the cap or on which
  other files this Python build ships.
  """
  root = sysconfig.get_paths()["stdlib"]
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    # Installed packages are not the standard library.
    dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages",
                                                      "__pycache__")]
    paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
  rel_paths = sorted(os.path.relpath(p, root) for p in paths)
  parts = {"train": [], "val": []}
  total = 0
  for rel in rel_paths:
    if total >= max_bytes:
      break
    try:
      with open(os.path.join(root, rel), "rb") as f:
        data = f.read(max_bytes - total)
    except OSError:
      continue
    total += len(data)
    val = zlib.crc32(rel.encode()) / 2**32 < val_frac
    parts["val" if val else "train"].append(data)
  train, val = (np.frombuffer(b"".join(parts[k]), dtype=np.uint8) for k in ("train", "val"))
  return train, val


def _windows_split(corpus_L: np.ndarray, starts_N: np.ndarray, t: int) -> Split:
  offsets_T1 = np.arange(t + 1)

  def gather(idx_B):
    win_BxT1 = corpus_L[starts_N[idx_B][:, None] + offsets_T1].astype(np.int32)
    return {"x": win_BxT1[:, :-1], "y": win_BxT1[:, 1:]}

  return Split(len(starts_N), gather)


@dataclasses.dataclass(frozen=True)
class ByteLM(DataSource):
  """Byte-level language modelling: windows of T + 1 bytes (x = the first T, y = the last T,
  i.e. the next byte of each x), vocabulary 256.

  Train windows start every T bytes (consecutive windows share one byte: the last target of one
  is the first input of the next). Eval windows are at most max_eval_windows starts evenly spread
  over the val bytes (all stride-T windows when max_eval_windows is 0).
  """

  batch_size: int = 32
  eval_batch_size: int | None = 64
  context_length: int = setting(128, POSITIVE)   # T
  val_frac: float = setting(0.1, OPEN_UNIT)      # share of the bytes held out
  max_eval_windows: int = setting(512, NONNEG)   # 0: every stride-T val window

  def windows(self, train_L, val_L, key) -> Source:
    """The `Source` over byte arrays; `key` names the setting to blame for a too-short split."""
    t = self.context_length
    for name, arr in (("train", train_L), ("val", val_L)):
      if len(arr) < t + 1:
        raise ValueError(f"data.{key}: the {name} split has {len(arr)} bytes, fewer than "
                         f"context_length + 1 = {t + 1}")
    train_starts = np.arange(0, len(train_L) - t, t)
    val_starts = np.arange(0, len(val_L) - t, t)
    if 0 < self.max_eval_windows < len(val_starts):
      val_starts = np.linspace(0, len(val_L) - t - 1, self.max_eval_windows).astype(np.int64)
    tr, ev = _windows_split(train_L, train_starts, t), _windows_split(val_L, val_starts, t)
    return Source(tr, ev, _info("lm", tr, ev, (t,), vocab_size=256))


@register_source("text")
@dataclasses.dataclass(frozen=True)
class Text(ByteLM):
  max_bytes: int = setting(2_000_000, POSITIVE)  # cap on the stdlib bytes read

  def build(self) -> Source:
    train_L, val_L = stdlib_corpus(self.max_bytes, self.val_frac)
    return self.windows(train_L, val_L, "max_bytes")


def existing_path(path: str, *, file: bool = True) -> str:
  """`data.path` with `~` expanded, refused in one line when it names no file (or, `file` False,
  neither a file nor a folder)."""
  full = os.path.expanduser(path)
  if not path or not (os.path.isfile(full) if file else os.path.exists(full)):
    raise ValueError(f"data.path: {'file ' if file else ''}not found: {path!r}")
  return full


@register_source("textfile")
@dataclasses.dataclass(frozen=True)
class TextFile(ByteLM):
  path: str = ""  # the file; its last val_frac of bytes is the eval split

  def build(self) -> Source:
    with open(existing_path(self.path), "rb") as f:
      corpus_L = np.frombuffer(f.read(), dtype=np.uint8)
    cut = len(corpus_L) - int(round(self.val_frac * len(corpus_L)))
    return self.windows(corpus_L[:cut], corpus_L[cut:], "path")


# --- user arrays -------------------------------------------------------------------------------

def _cast_y(y, kind):
  return y.astype(np.int32 if kind in ("classification", "lm") else np.float32)


def _check_arrays(path: str, kind: str, split_name: str, split: dict[str, np.ndarray]) -> None:
  """Refuses values the task would silently train on wrongly: non-finite floats, and labels
  that are negative (or, for classification and lm, not integers: class indices, token ids)."""
  for k, a in split.items():
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
      raise ValueError(f"data.path: {path!r}: {split_name} {k} holds non-finite values")
  if "y" not in split or kind not in ("classification", "binary", "lm"):
    return
  y = split["y"]
  integral = (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.bool_) or
              (np.issubdtype(y.dtype, np.floating) and (y == np.round(y)).all()))
  if kind != "binary" and not integral:
    raise ValueError(f"data.path: {path!r}: {split_name} y must hold integer labels for kind "
                     f"{kind!r}, got dtype {y.dtype}")
  if y.size and y.min() < 0:
    raise ValueError(f"data.path: {path!r}: {split_name} y holds negative labels (min "
                     f"{y.min()}); kind {kind!r} needs labels >= 0")


@register_source("npz")
@dataclasses.dataclass(frozen=True)
class Npz(DataSource):
  """Arrays x, y (optional x_eval, y_eval, else a seeded eval_frac holdout) from a .npz file."""

  path: str = ""
  kind: str = setting("classification", one_of(*KINDS))  # the task the arrays are for
  eval_frac: float = setting(0.1, OPEN_UNIT)   # holdout share when there is no x_eval
  data_seed: int = 0                           # seeds the holdout permutation

  def build(self) -> Source:
    path, kind = existing_path(self.path), self.kind
    try:
      with np.load(path, allow_pickle=False) as f:
        arrays = {k: np.asarray(f[k]) for k in f.files}
    except Exception as e:  # noqa: BLE001 -- truncated zips raise BadZipFile, EOFError, ...
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ValueError(f"data.path: cannot read {path!r} as .npz (truncated or not an npz "
                       f"file?): {first}") from e
    if "x" not in arrays or ("y" not in arrays and kind != "generative"):
      raise ValueError(f"data.path: {path!r} must hold arrays 'x' and 'y' (kind {kind!r}); "
                       f"found {sorted(arrays)}")
    keys = [k for k in ("x", "y") if k in arrays]
    for k in keys:
      if len(arrays[k]) != len(arrays["x"]):
        raise ValueError(f"data.path: {path!r}: len({k}) = {len(arrays[k])} differs from "
                         f"len(x) = {len(arrays['x'])}")
    if "x_eval" in arrays:
      train = {k: arrays[k] for k in keys}
      eval_ = {k: arrays[k + "_eval"] for k in keys if k + "_eval" in arrays}
      if set(eval_) != set(train):
        raise ValueError(f"data.path: {path!r} has x_eval but not y_eval")
    else:
      # A seeded holdout: the same file and data_seed always give the same split.
      n = len(arrays["x"])
      n_eval = int(round(self.eval_frac * n))
      if not 0 < n_eval < n:
        raise ValueError(f"data.eval_frac: {self.eval_frac} of {n} examples leaves an empty "
                         "train or eval split")
      perm_N = np.random.default_rng(self.data_seed).permutation(n)
      train = {k: arrays[k][perm_N[n_eval:]] for k in keys}
      eval_ = {k: arrays[k][perm_N[:n_eval]] for k in keys}
    for name, split in (("train", train), ("eval", eval_)):
      _check_arrays(path, kind, name, split)
    for split in (train, eval_):
      if np.issubdtype(split["x"].dtype, np.floating):
        split["x"] = split["x"].astype(np.float32)
      elif kind == "lm":
        split["x"] = split["x"].astype(np.int32)
      if "y" in split:
        split["y"] = _cast_y(split["y"], kind)
    num_classes = vocab_size = None
    if kind == "classification":
      num_classes = int(max(train["y"].max(), eval_["y"].max())) + 1
    elif kind == "binary":
      num_classes = 2
    elif kind == "lm":
      vocab_size = int(max(train["x"].max(), train["y"].max())) + 1
    return arrays_source(kind, train, eval_, num_classes, vocab_size)

