"""A run's init program with its random draws hashed together (`jaxdl.train.batched_draws`) vs
the plain jaxpr.

  init  CPU seconds to lower and compile `Run.init_state`'s program (the model's and the
        optimizer's init from the run's key) with the draws batched vs as traced: ratio =
        batched / plain, target < 1. Both are the same jaxpr, traced once; each variant is
        lowered and compiled afresh (no persistent compilation cache unless
        JAX_COMPILATION_CACHE_DIR names one), best of `rounds` alternations. Measured on this
        2-core CPU, jax 0.10.2, 2026-12-03, XLA's default flags (`jaxdl bench --only init`):
          edm_digits:smoke   6.51 vs 30.4 CPU-s   0.214x   U-Net: 136 Threefry calls -> 3
          digits_cnn:smoke   1.52 vs 5.36 CPU-s   0.284x
          char_gpt:smoke     2.53 vs 3.67 CPU-s   0.688x   its scan's body batched on its own
        At the test suite's flags (XLA's optimization level 0) the U-Net's init compiled in
        1.76 against 4.19 CPU-s.
"""

from __future__ import annotations

import time

EXPERIMENTS = ("edm_digits:smoke", "digits_cnn:smoke", "char_gpt:smoke")


def _compile_cpu(fn, keys) -> float:
  import jax
  jax.clear_caches()  # else a repeat is served from the in-memory cache of compiled programs
  t = time.process_time()
  jax.jit(fn).lower(*keys).compile()
  return time.process_time() - t


def bench_init(experiments=EXPERIMENTS, rounds: int = 2) -> dict:
  """{experiment: {'batched': cpu_s, 'plain': cpu_s, 'ratio': batched / plain}}."""
  import jax
  from jax.extend import core as jcore
  from jaxdl.config import load_config
  from jaxdl.train import batched_draws, build
  out = {}
  for exp in experiments:
    run = build(load_config(exp, ["parallel.devices=1"])[0])
    traced = run._init_traced()  # pylint: disable=protected-access
    keys = jax.tree.leaves(run.init_key)
    variants = {"batched": batched_draws.batch_draws(traced.jaxpr),
                "plain": jcore.jaxpr_as_fun(traced.jaxpr)}
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
      for name, fn in variants.items():
        best[name] = min(best[name], _compile_cpu(fn, keys))
    out[exp] = {**best, "ratio": best["batched"] / best["plain"]}
  return out
