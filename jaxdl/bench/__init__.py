"""jaxdl's speed as ratios to baselines (`jaxdl bench [--only NAME[,NAME]] [--json FILE]`, in
`jaxdl.cli.bench`).

Every figure is a ratio of two timings from the same process and the same run (the machine may
be shared and noisy; absolute numbers are printed but only ratios are judged):

  gpt         GPT train step tokens/s vs a plain-Flax baseline (target >= 1.2x); model FLOP/s and
              MFU against a large matmul timed in the same run (`jaxdl.bench.gpt`). On a GPU:
              GPT-2 small in bf16 with cuDNN attention (target MFU >= 45%).
  compile     train-step compile seconds at 2, 8, 24 layers, scanned vs unrolled (scan at 24
              within 1.5x of 2).
  loop        `jaxdl.train.run` steps/s vs a bare loop over the same jitted step (<= 5%).
  watch       the health signals' cost per step at one watched step in 100, cheap (<= 5%)
              and detailed (<= 10%), vs the plain step (`jaxdl.bench.engine.bench_watch`).
  checkpoint  time an async save blocks the loop vs a synchronous save (<= 20%).
  sampler     lax-loop sampler's time over N x the same compiled denoiser-plus-update step
              timed alone (<= 1.05), fm_toy2d's and fm_digits_cfg's denoisers (same samples as
              a Python loop over the step); heun, edm_heun, dpmpp_2m and dpmpp_3m's time per
              sample over Euler's at equal network calls (20, fm_digits_cfg's U-Net; <= 1.05).
  data        data pipeline batches/s vs the train step's steps/s (>= 1: the step never waits);
              grain vs a PyTorch DataLoader doing the same work with the same workers (0 and 2),
              for the packed BPE and the augmented image pipelines (>= 1; `jaxdl.bench.loaders`,
              torch from the `bench` extra, else one row saying how to install it).
  accum       a train step at train.grad_accum=4 vs 4 microbatch steps (<= 1.1), and its
              compiled temporary memory vs one microbatch step's (<= 1.3), for the digits CNN,
              the digits MLP with BatchNorm, a 2-layer char GPT and the digits U-Net
              (`jaxdl.bench.cnn`).
  xla_cpu     a user's run (digits_cnn at train.grad_accum=4, its own batch) with the XLA:CPU
              workarounds (`jaxdl.train.xla_cpu`) on vs off: step seconds (< 0.9: the bar a
              workaround must clear to stay; `jaxdl.bench.cnn.bench_xla_cpu`).
  augment     the augmented image pipeline's batches/s vs the CNN's train steps/s (>= 1), on
              the digits and on 32x32 RGB with every record-level op.
  data_bpe    bpe_gpt's packed BPE pipeline (ArrayRecord, segment ids) batches/s vs its train
              step's steps/s (>= 1; `jaxdl.bench.text_data`); and vs the DataLoader when the
              data bench did not run.
  moe         GPT train step with 8-expert top-2 MoE MLPs vs the dense GPT of the same active
              compute (<= 1.5x; `jaxdl.bench.blocks`).
  moe_dispatch  one MoE layer's forward + backward with the index dispatch it uses vs a one-hot
              (N, E, C) dispatch einsum, N = 512 and 2048 tokens (`jaxdl.bench.blocks`).
  ssm         train-step CPU seconds of mixer='ssm' vs attention at T = 128 .. 1024, same
              tokens per step: the SSM's stays flat, attention's grows with T.
  lora        optimizer-state bytes of LoRA at rank 8 vs full fine-tuning on GPT-2 small, from
              shapes alone (<= 2%; `jaxdl.bench.lora`).
  tensor      the compiled GPT step's per-device argument and temporary bytes at tensor 2 and 4
              vs 1 on 4 CPU devices (arguments = the sharding plan's bytes, ~1/T; temporaries
              fall; `jaxdl.bench.tensor`).
  memory      the compiled GPT train step's temporary bytes at T = 4096 (vocabulary 32768) with
              the chunked lm loss (`train.loss_chunk`; the B x T x V logits gone: the saving
              >= the logits' bytes) and with each `model.remat` policy, vs the plain step
              (each < 1; `jaxdl.bench.memory`; offload only on an accelerator).
  sequence    one row of T = 4096 tokens split over S = 1, 2, 4 emulated CPU devices
              (`parallel.sequence`): the compiled GPT step's per-device temporary bytes (< 1 of
              S = 1's), its step seconds (on one CPU not a speedup), the chunked loss's saving
              against the logits' bytes, and the causal ring's blocks and time vs non-causal
              (`jaxdl.bench.sequence`).
  startup     a whole `jaxdl train EXP:smoke` process's CPU seconds with the library's heap
              frozen after its imports (`jaxdl.cli.load_library_frozen`) vs without (< 1;
              `jaxdl.bench.startup`).
  (init      removed 2026-12-06 with what it measured, the init's Threefry draws hashed together:
              its gain on a user's run was under 10%; numbers in `jaxdl.train.xla_cpu`.)
  hf_load     peak host memory of `jaxdl.models.hf.load_hf` loading a generated bf16 Llama
              checkpoint of 1.24B parameters (2.47 GB, 3 shards) in a fresh process, vs its size
              on disk (<= 1.3; `jaxdl.bench.hf_load`; JAXDL_BENCH_HF_LOAD=tiny for a toy size).

The whole bench took 1006 s (about 17 minutes, 1562 CPU-s) on an idle 2-core CPU without torch
(session 17; the README copies this figure); `init` (since removed) took 109 s alone; `hf_load`,
added since, takes 90 s alone (58 s writing the 1b checkpoint, 8-21 s loading it); `memory`,
added since, 57 s alone (35 CPU-s: six compiles of a T = 4096 step).

The registry and table row are in `registry.py`, the registered benchmarks in `benches.py`, the
runner (`run_benches`) here.
"""

from __future__ import annotations

import time

from jaxdl.bench.benches import BENCHES
from jaxdl.bench.registry import REGISTRY, experiments_of

__all__ = ["BENCHES", "REGISTRY", "experiments_of", "run_benches"]


def run_benches(names: list[str], log=print, configs=None) -> tuple[dict, list[dict]]:
  """Runs the named benchmarks in registry order; returns (raw results, table rows).
  `configs`: {spec: config} of every spec of `experiments_of(names)`, loaded by the caller."""
  import jax
  from jaxdl.bench import gpt
  configs = configs or {}
  missing = [s for s in experiments_of(names) if s not in configs]
  if missing:
    raise ValueError(f"run_benches: configs of {missing} missing; the benchmarks measure them "
                     "(load each with jaxdl.config.load_config)")
  ctx = {"setup": gpt.default_setup(), "on_gpu": jax.default_backend() == "gpu", "step_s": None,
         "configs": configs}
  results: dict = {"backend": jax.default_backend(), "devices": jax.device_count(),
                   "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__}
  rows: list[dict] = []
  for name in names:
    t0 = time.perf_counter()
    log(f"bench: {name} ...")
    r, new_rows = REGISTRY[name](ctx)
    rows += new_rows
    r["seconds"] = time.perf_counter() - t0
    results[name] = r
  return results, rows

