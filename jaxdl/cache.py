"""Where jaxdl keeps what it computes once per machine and reuses in every process: built-in
corpora prepared for training (`jaxdl.data.disk`), scikit-learn's embedded datasets
(`jaxdl.data.embedded_cache`) and the timed matmul peak behind MFU (`jaxdl.train.throughput`).

One root for all of them: $JAXDL_CACHE, else ~/.cache/jaxdl. The peak's cache once read
$JAXDL_CACHE_DIR instead; that name is still honoured when $JAXDL_CACHE is unset.
"""

from __future__ import annotations

import os


def cache_dir() -> str:
  """The cache root: $JAXDL_CACHE, else $JAXDL_CACHE_DIR (the older name), else ~/.cache/jaxdl."""
  root = os.environ.get("JAXDL_CACHE") or os.environ.get("JAXDL_CACHE_DIR") or "~/.cache/jaxdl"
  return os.path.expanduser(root)
