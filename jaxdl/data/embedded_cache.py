"""scikit-learn's embedded datasets (moons, digits) kept on disk once per scikit-learn version."""

from __future__ import annotations

import contextlib
import os
from typing import Callable

import numpy as np

from jaxdl import cache
from jaxdl.data import staging


def sklearn_arrays(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """`build()`'s arrays (scikit-learn's embedded datasets), kept once per scikit-learn version in
  `<cache root>/embedded/` (`jaxdl.cache`: $JAXDL_CACHE, default ~/.cache/jaxdl): importing
  scikit-learn costs each process about 2 CPU-s, reading the cached file about a millisecond.
  The file is written whole and renamed into place, so concurrent runs never read half of one;
  the temporary file of a process killed while writing is removed by the next that writes."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  root = os.path.join(cache.cache_dir(), "embedded")
  path = os.path.join(root, f"{name}-sklearn{metadata.version('scikit-learn')}.npz")
  try:
    with np.load(path) as f:
      return {k: f[k] for k in f.files}
  except (OSError, ValueError, EOFError):  # absent, unreadable or truncated: build it again
    pass
  arrays = build()
  tmp = None
  try:
    os.makedirs(root, exist_ok=True)
    tmp = staging.temporary(path)  # (and the files of processes killed while writing removed)
    with open(tmp, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except OSError:  # a read-only home or a full disk: the arrays are still right, only not kept
    if tmp is not None:
      with contextlib.suppress(OSError):
        os.remove(tmp)
  return arrays
