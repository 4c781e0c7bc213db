"""Images from disk: a class-per-folder tree and an npz of images; their preparation to shards.

Shapes: N images, H height, W width, C channels (1 for mode 'L', 3 for 'RGB').

  image_folder  root/<class>/*.png|jpg; classes are the sorted folder names (label = index);
                images are read when a batch asks for them; x = pixels / 255, float32 (H, W, C).
                Every image must have the size and mode of the first (after converting to
                `mode` when set); the headers are checked when the source is built. A class
                folder without images is refused (it would be a class nothing can teach).
  npz_images    x uint8 (N, H, W) or (N, H, W, C) and y; x / 255 as above.
Eval: `eval_path` (a second tree / npz) or a seeded `eval_frac` holdout of the training set.
Both take `augment`: the training stream's ops of `jaxdl.data.augment`, drawn per record exactly
as for the embedded images. A folder with fewer training images than `data.batch_size` (128 by
default) is refused when the source is built, naming data.batch_size, the image count and a
batch that fits (`DataSource.check_batch`); the batch is never shrunk silently.

Errors name the setting to change as the caller spells it: `key` is 'data.path' (and data.mode)
for the sources, 'SRC' (and --mode) for `jaxdl data prepare`.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxdl.data import records, staging
from jaxdl.data.augment import augment_setting
from jaxdl.schema import OPEN_UNIT, one_of, setting
from jaxdl.data.registry import DataSource, Source, Split, register_source

SUFFIXES = (".png", ".jpg", ".jpeg")


def list_folder(root: str, key: str = "data.path", allow_empty: bool = False
                ) -> tuple[list[str], np.ndarray, list[str]]:
  """(relative paths, labels (N,), class names) of root/<class>/*.png|jpg, sorted; a class
  folder without images is a one-line ValueError naming it, unless `allow_empty` (an eval tree
  may lack a class)."""
  if not os.path.isdir(root):
    raise ValueError(f"{key}: image folder not found: {root!r}")
  classes = sorted(d for d in os.listdir(root)
                   if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
  paths, labels, empty = [], [], []
  for label, cls in enumerate(classes):
    names = sorted(f for f in os.listdir(os.path.join(root, cls))
                   if f.lower().endswith(SUFFIXES))
    paths += [os.path.join(cls, f) for f in names]
    labels += [label] * len(names)
    if not names:
      empty.append(cls)
  kinds = "/".join(SUFFIXES)
  if not paths:
    if empty:
      raise ValueError(f"{key}: the class folders of {root!r} hold no images ({_names(empty)}: "
                       f"no {kinds} files)")
    raise ValueError(f"{key}: {root!r} has no class folders; expected root/<class>/*.png|jpg")
  if empty and not allow_empty:
    raise ValueError(f"{key}: class folder{'s' if len(empty) > 1 else ''} {_names(empty)} of "
                     f"{root!r} hold{'' if len(empty) > 1 else 's'} no images (no {kinds} "
                     "files); add images or remove the folder (every folder is a class)")
  return paths, np.asarray(labels, np.int32), classes


def _names(names: list[str], most: int = 5) -> str:
  return ", ".join(repr(n) for n in names[:most]) + (", ..." if len(names) > most else "")


def check_images(root: str, paths: list[str], mode: str, key: str = "data.path"):
  """(H, W, C) shared by every image (headers only); ValueError naming the first that differs
  from the first image, as a size mismatch (resize) or a mode mismatch (the mode setting,
  data.mode or --mode, converts)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  mode_key = "--mode" if key == "SRC" else "data.mode"
  first = expected = None
  for rel in paths:
    full = os.path.join(root, rel)
    try:
      with Image.open(full) as im:
        got = (im.size, mode or im.mode)
        if mode and im.mode != mode and not _convertible(im.mode, mode):
          raise ValueError(f"{key}: {full!r} has mode {im.mode}, which does not convert to "
                           f"{mode_key} {mode}")
    except OSError as e:
      raise ValueError(f"{key}: cannot read {full!r} as an image: {e}") from e
    if expected is None:
      first, expected = full, got
    elif got[0] != expected[0]:
      raise ValueError(f"{key}: {full!r} is {got[0][0]}x{got[0][1]} (width x height) but the "
                       f"first image {first!r} is {expected[0][0]}x{expected[0][1]}; every image "
                       "must have one size: resize them")
    elif got[1] != expected[1]:
      raise ValueError(f"{key}: {full!r} has mode {got[1]} but the first image {first!r} has "
                       f"mode {expected[1]}; set {mode_key} to L or RGB to convert every image")
  (w, h), m = expected
  if m not in CHANNELS:
    raise ValueError(f"{key}: images of mode {m!r} are not supported; set {mode_key} to L or "
                     "RGB")
  return h, w, CHANNELS[m]


CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


def _convertible(src: str, dst: str) -> bool:
  return {src, dst} <= {"L", "RGB", "RGBA", "P", "1", "LA"}


def load_image(path: str, mode: str) -> np.ndarray:
  """uint8 (H, W, C)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(path) as im:
    a = np.asarray(im.convert(mode) if mode and im.mode != mode else im)
  return a[..., None] if a.ndim == 2 else a


def _folder_split(root, paths, labels, mode) -> Split:
  def gather(idx_B):
    x = np.stack([load_image(os.path.join(root, paths[i]), mode) for i in idx_B])
    return {"x": x.astype(np.float32) / 255.0, "y": labels[idx_B]}
  return Split(len(paths), gather)


def holdout(n: int, eval_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train indices, eval indices): a seeded permutation's last / first eval_frac share."""
  n_eval = int(round(eval_frac * n))
  if not 0 < n_eval < n:
    raise ValueError(f"data.eval_frac: {eval_frac} of {n} examples leaves an empty train or "
                     "eval split")
  perm_N = np.random.default_rng(seed).permutation(n)
  return np.sort(perm_N[n_eval:]), np.sort(perm_N[:n_eval])


def _info(tr: Split, ev: Split, shape, num_classes: int) -> dict:
  return dict(kind="classification", num_classes=num_classes, vocab_size=None,
              input_shape=tuple(int(s) for s in shape), num_train=tr.num, num_eval=ev.num)


@register_source("image_folder")
@dataclasses.dataclass(frozen=True)
class ImageFolder(DataSource):
  """root/<class>/*.png|jpg, read batch by batch (module docstring)."""
  path: str = ""
  eval_path: str = ""                            # "": a seeded eval_frac holdout of path
  eval_frac: float = setting(0.1, OPEN_UNIT)
  data_seed: int = 0
  mode: str = setting("", one_of("", "L", "RGB"))  # "": the images' own mode
  augment: tuple = augment_setting()               # training ops (jaxdl.data.augment)

  def build(self) -> Source:
    root = os.path.expanduser(self.path)
    paths, labels, classes = list_folder(root)
    shape = check_images(root, paths, self.mode)
    if self.eval_path:
      eroot = os.path.expanduser(self.eval_path)
      epaths, elabels, eclasses = list_folder(eroot, "data.eval_path", allow_empty=True)
      if eclasses != classes:
        raise ValueError(f"data.eval_path: classes {eclasses} differ from data.path's {classes}")
      if check_images(eroot, epaths, self.mode, "data.eval_path") != shape:
        raise ValueError(f"data.eval_path: images are not {shape} like data.path's")
      tr, ev = (_folder_split(root, paths, labels, self.mode),
                _folder_split(eroot, epaths, elabels, self.mode))
    else:
      tr_idx, ev_idx = holdout(len(paths), self.eval_frac, self.data_seed)
      tr, ev = (_folder_split(root, [paths[i] for i in idx], labels[idx], self.mode)
                for idx in (tr_idx, ev_idx))
    held = "" if self.eval_path else f", {ev.num} more held out by data.eval_frac"
    self.check_batch(tr.num, f"images in {self.path!r}{held}")
    return Source(tr, ev, _info(tr, ev, shape, len(classes)))


def _image_arrays(x, where: str) -> np.ndarray:
  if x.dtype != np.uint8 or x.ndim not in (3, 4):
    raise ValueError(f"data.path: {where}: expected uint8 images (N, H, W) or (N, H, W, C), "
                     f"got {x.dtype} {x.shape}")
  return (x[..., None] if x.ndim == 3 else x).astype(np.float32) / 255.0


@register_source("npz_images")
@dataclasses.dataclass(frozen=True)
class NpzImages(DataSource):
  """uint8 images x and labels y (optional x_eval, y_eval) from an .npz (module docstring)."""
  path: str = ""
  eval_frac: float = setting(0.1, OPEN_UNIT)
  data_seed: int = 0
  augment: tuple = augment_setting()               # training ops (jaxdl.data.augment)

  def build(self) -> Source:
    from jaxdl.data.sources import arrays_source  # pylint: disable=g-import-not-at-top
    path = os.path.expanduser(self.path)
    if not os.path.isfile(path):
      raise ValueError(f"data.path: file not found: {self.path!r}")
    try:
      with np.load(path, allow_pickle=False) as f:
        arrays = {k: np.asarray(f[k]) for k in f.files}
    except Exception as e:  # noqa: BLE001 -- truncated zips raise BadZipFile, EOFError, ...
      raise ValueError(f"data.path: cannot read {path!r} as .npz: {e}") from e
    if "x" not in arrays or "y" not in arrays or len(arrays["x"]) != len(arrays["y"]):
      raise ValueError(f"data.path: {path!r} must hold images 'x' and labels 'y' of one length; "
                       f"found {sorted(arrays)}")
    x, y = _image_arrays(arrays["x"], "x"), arrays["y"].astype(np.int32)
    if "x_eval" in arrays and "y_eval" in arrays:
      train = {"x": x, "y": y}
      eval_ = {"x": _image_arrays(arrays["x_eval"], "x_eval"),
               "y": arrays["y_eval"].astype(np.int32)}
    else:
      tr_idx, ev_idx = holdout(len(x), self.eval_frac, self.data_seed)
      train, eval_ = {"x": x[tr_idx], "y": y[tr_idx]}, {"x": x[ev_idx], "y": y[ev_idx]}
    if min(train["y"].min(), eval_["y"].min()) < 0:
      raise ValueError(f"data.path: {path!r}: labels must be >= 0")
    num_classes = int(max(train["y"].max(), eval_["y"].max())) + 1
    return arrays_source("classification", train, eval_, num_classes=num_classes)


def prepare_images(src: str, out_dir: str, *, val_frac: float = 0.1, mode: str = "",
                   shard_size: int = 4096, force: bool = False) -> dict:
  """root/<class>/*.png|jpg -> (x uint8 (H, W, C), y int32) records + manifest in `out_dir`;
  an image goes to val when crc32(its relative path) / 2^32 < val_frac (a split left empty is
  refused before anything is written, naming --val-frac: `jaxdl.data.prepare.split_error`).
  The output folder is checked and written as `prepare.prepare_text`'s (`staging.check_out`
  unless `force`, `staging.staged_output`)."""
  from jaxdl.data import prepare  # pylint: disable=g-import-not-at-top
  if not force:
    staging.check_out(out_dir, src, None)
  paths, labels, classes = list_folder(src, "SRC")
  shape = check_images(src, paths, mode, "SRC")
  problem = prepare.split_error(paths, val_frac, src, "images")
  if problem:
    raise ValueError(problem)
  fields = {"x": {"shape": list(shape), "dtype": "uint8"}, "y": {"shape": [], "dtype": "int32"}}
  splits = {}
  with staging.staged_output(out_dir, None) as stage:
    for split in ("train", "val"):
      idx = [i for i, p in enumerate(paths) if prepare.in_val(p, val_frac) == (split == "val")]
      examples = ({"x": load_image(os.path.join(src, paths[i]), mode), "y": labels[i]}
                  for i in idx)
      splits[split] = prepare.write_split(stage, split, examples, len(idx), fields, shard_size,
                                          f"{split} images")
    return records.write_manifest(stage, {
        "kind": "classification", "fields": fields, "splits": splits, "classes": classes,
        "source": os.path.abspath(src)})
