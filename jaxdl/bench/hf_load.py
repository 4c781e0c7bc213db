"""Peak host memory of `jaxdl.models.hf.load_hf` against the checkpoint's size on disk.

A Llama-shaped checkpoint in bf16 is generated in a temporary folder (random weights, written
shard by shard, never whole in memory), then loaded by a fresh process (`python -m
jaxdl.bench.hf_load DIR`) that reports its resident memory after its imports (R0) and its peak
(VmHWM) after `load_hf`:

  ratio = (VmHWM - R0) / bytes of the safetensors files      target <= 1.3

The page cache the reads go through is the kernel's, not the process's: what is counted is
what loading keeps and copies. Sizes (`SIZES`): '1b', Llama-3.2-1B's shape (1.24B parameters,
2.47 GB, tied embeddings of 128256 x 2048), the default; 'tiny' for the test suite (set
JAXDL_BENCH_HF_LOAD=tiny for the registered bench).

Measured on the 2-core CPU (jax's CPU backend, so the parameters themselves live in host
memory), 1b: peak 2.72 GB while loading 2.47 GB of bf16 shards, 1.10x (the parameters, still
bf16, are 1.00x of it); load 8-21 s (two runs). Before, `load_hf` read every shard whole and
widened to float32: 6.5x (issue 50: an 853M checkpoint of 1.7 GB peaked at 11.2 GB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

SIZES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
}
SHARD_BYTES = 1 << 30  # transformers' shards are a few GB; two or more here at 1b


def llama_config(size: dict) -> dict:
  return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **size,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def shapes(size: dict) -> dict[str, tuple]:
  """{HF tensor name: shape} of the checkpoint (`jaxdl.models.hf_families`' table)."""
  from jaxdl.models import hf_families, hf_tensors  # pylint: disable=g-import-not-at-top
  model = hf_families.model_from_config(llama_config(size))
  return hf_tensors._table(model, "llama")[0]  # pylint: disable=protected-access


def param_count(size: dict) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  return int(sum(np.prod(s) for s in shapes(size).values()))


def write_checkpoint(size: dict, directory: str, seed: int = 0) -> int:
  """Writes config.json and bf16 shards of random weights (N(0, 0.02^2), norms 1) to
  `directory`, one shard in memory at a time; returns the bytes of the weight files."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdl.models import hf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  table = shapes(size)
  groups, total = [[]], 0
  for name, shape in table.items():
    n = int(np.prod(shape)) * 2
    if groups[-1] and total + n > SHARD_BYTES:
      groups.append([])
      total = 0
    groups[-1].append(name)
    total += n
  weight_map = {}
  for i, names in enumerate(groups):
    file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
    tensors = {}
    for name in names:
      if name.endswith("norm.weight"):
        tensors[name] = np.ones(table[name], ml_dtypes.bfloat16)
      else:
        tensors[name] = (0.02 * rng.standard_normal(table[name], np.float32)).astype(
            ml_dtypes.bfloat16)
    hf.write_safetensors(os.path.join(directory, file), tensors, {"format": "pt"})
    weight_map.update({n: file for n in names})
    del tensors
  with open(os.path.join(directory, hf.INDEX), "w", encoding="utf-8") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
    json.dump(llama_config(size), f)
  return sum(os.path.getsize(os.path.join(directory, f)) for f in set(weight_map.values()))


def _status_kib(field: str) -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measure_load(directory: str) -> dict:
  """In this process: resident bytes before, peak bytes after `load_hf(directory)`, seconds,
  and the parameters' bytes and dtypes (what `python -m jaxdl.bench.hf_load` prints)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxdl.models import hf  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(jnp.zeros(8) + 1)  # the backend up before the baseline
  before = _status_kib("VmRSS") * 1024
  t0 = time.perf_counter()
  _, params = hf.load_hf(directory)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - t0
  leaves = jax.tree.leaves(params)
  return {"rss_before": before, "hwm": _status_kib("VmHWM") * 1024, "load_s": seconds,
          "param_bytes": int(sum(x.nbytes for x in leaves)),
          "dtypes": sorted({str(x.dtype) for x in leaves})}


def bench_hf_load(size: dict, workdir: str | None = None) -> dict:
  """Generates the checkpoint of `size` (in `workdir`, else a temporary folder removed after)
  and measures a fresh process loading it (module docstring)."""
  with tempfile.TemporaryDirectory(dir=workdir) as tmp:
    t0 = time.perf_counter()
    disk = write_checkpoint(size, tmp)
    write_s = time.perf_counter() - t0
    proc = subprocess.run([sys.executable, "-m", "jaxdl.bench.hf_load", tmp],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"the loading process failed: {proc.stderr.strip().splitlines()[-1:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
  peak = child["hwm"] - child["rss_before"]
  return {"params": param_count(size), "disk_bytes": disk, "peak_bytes": peak,
          "ratio": peak / disk, "write_s": write_s, **child}


if __name__ == "__main__":
  print(json.dumps(measure_load(sys.argv[1])))
