"""Benches that need several CPU devices: measured in this process when it has them, else in a
subprocess that emulates them (`XLA_FLAGS=--xla_force_host_platform_device_count=N`; XLA reads
the flag once, when this process's backend started)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable


def on_cpu_devices(measure: Callable[[], dict], module: str, devices: int,
                   timeout: int = 1200) -> dict:
  """`measure()` here when the backend is the CPU with >= `devices` devices, else the JSON that
  `python -m module` prints last (its `__main__` prints `measure()`'s) in a subprocess with
  `devices` emulated CPU devices. JSON keys are strings either way the caller reads them."""
  import jax
  if jax.default_backend() == "cpu" and jax.device_count() >= devices:
    return json.loads(json.dumps(measure()))
  flags = os.environ.get("XLA_FLAGS", "")
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}".strip()}
  proc = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True,
                        timeout=timeout, check=False)
  if proc.returncode:
    raise RuntimeError(f"{module} subprocess failed: {proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])
