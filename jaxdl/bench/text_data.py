"""The packed BPE text pipeline against the train step it feeds (`jaxdl bench --only data_bpe`).

bpe_gpt's data, as `experiments/bpe_gpt.py` trains on it: the standard library prepared to
ArrayRecord with a 4096-token BPE (`stdlib_bpe`, prepared once under the cache directory),
64-token windows of packed documents with segment ids, batch 32, read through the grain pipeline
(records fetched per window, segment and position ids computed per batch). The train step is
bpe_gpt's model (d 128, 4 layers, 4 heads, vocab 4096) on one of those batches, segment mask
included. Ratio = pipeline batches/s over train steps/s: >= 1 means the step never waits.
Measured on this 2-core CPU, otherwise idle (2026-12-02, three runs, median first): 343x
(1,090 batches/s vs 3.2 steps/s; 304x and 354x). Before the decoded-document cache
(`packing.DocStream`) it read 53x under a load average of about 25.

The PyTorch DataLoader doing the same work (the same records, packing and workers) is
`jaxdl.bench.loaders`, reported in the `data` rows (and here when `data` did not run).
"""

from __future__ import annotations

import time

import jax.numpy as jnp

from jaxdl import data as jdata
from jaxdl.bench import gpt
from jaxdl.config import base_config

SETUP = gpt.GPTSetup("bpe_gpt", batch=32, context=64, vocab=4096, d_model=128, n_layer=4,
                     n_head=4, dtype="float32", peak_n=1024, scan_unroll=4)


def bpe_config(setup: gpt.GPTSetup = SETUP):
  """bpe_gpt's `data` section at the setup's vocab, context and batch, with segment ids."""
  config = base_config()
  config.data = jdata.default_data_config("stdlib_bpe")
  config.data.update(vocab=setup.vocab, context_length=setup.context, batch_size=setup.batch,
                     segment_ids=True)
  return config


def bpe_dataset(setup: gpt.GPTSetup = SETUP):
  return jdata.make_dataset(bpe_config(setup))


def bpe_directory(setup: gpt.GPTSetup = SETUP) -> str:
  """The prepared ArrayRecord directory `bpe_dataset` reads (prepared by building it)."""
  return jdata.parse_data(bpe_config(setup).data).directory()


def bench_packed_bpe(n: int = 40, setup: gpt.GPTSetup = SETUP) -> dict:
  """{'batches_per_s', 'steps_per_s', 'ratio'} for bpe_gpt's pipeline and step."""
  it = bpe_dataset(setup).train_iter()
  batch = next(it)
  start = time.perf_counter()
  for _ in range(n):
    next(it)
  batches_per_s = n / (time.perf_counter() - start)
  state, step = gpt.jaxdl_step(setup)
  run = gpt.runner(state, step, {k: jnp.asarray(v) for k, v in batch.items()})
  run(1)  # compiles
  step_s = gpt.interleaved({"step": run}, steps=5, rounds=2)["step"]["wall"]
  return {"batches_per_s": batches_per_s, "steps_per_s": 1.0 / step_s,
          "ratio": batches_per_s * step_s, "batches": n}
