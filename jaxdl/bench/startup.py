"""A whole `jaxdl train` process with and without the frozen library heap
(`jaxdl.cli.load_library_frozen`).

  startup  CPU seconds of `python -m jaxdl train EXP:smoke` (import, build, compile, 20 steps,
           checkpoint, evaluation) as the command runs it against the same process with
           `jaxdl.cli.FREEZE_LIBRARY_HEAP = False`: ratio = frozen / unfrozen, target < 1 (the
           freeze pays). Both compile the same programs (no persistent compilation cache
           unless JAX_COMPILATION_CACHE_DIR names one). Each process is timed by its own CPU
           seconds (`resource.RUSAGE_CHILDREN`); the best of `rounds` alternations is kept.
           Measured on this 2-core CPU, jax 0.10.2, 2026-12-02:
             moons_mlp:smoke   9.31 vs 10.7 CPU-s   0.866x
             char_gpt:smoke    28.5 vs 30.6 CPU-s   0.932x
           With the test suite's XLA flags and a warm compilation cache, where less of a
           process is XLA's own compile, the share is larger: char_gpt:smoke 9.6-10.0 vs
           11.4-12.0 CPU-s (0.83x), edm_digits:smoke (batch 64 then) 21.3-23.5 vs 24.3-26.5
           (0.87x), three alternations each. Pausing the collector during the imports alone
           saved about 0.6 CPU-s of those; the rest is the full collections that tracing and
           compiling trigger, which no longer walk the library's objects.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile

# The baseline: the same command through `jaxdl.cli.main`, with the freeze switched off.
_UNFROZEN = ("import sys\nfrom jaxdl import cli\ncli.FREEZE_LIBRARY_HEAP = False\n"
             "sys.argv = ['jaxdl', *sys.argv[1:]]\nsys.exit(cli.main())")


def _child_cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


def _timed(argv: list[str]) -> float:
  """CPU seconds of one finished child process running `argv`."""
  before = _child_cpu()
  subprocess.run(argv, check=True, capture_output=True, timeout=900)
  return _child_cpu() - before


def bench_startup(experiments=("moons_mlp:smoke", "char_gpt:smoke"), rounds: int = 3) -> dict:
  """{experiment: {'frozen': cpu_s, 'unfrozen': cpu_s, 'ratio': frozen / unfrozen}}: each
  variant's best CPU seconds over `rounds` alternations, every run in a fresh workdir."""
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for exp in experiments:
      best = {"frozen": float("inf"), "unfrozen": float("inf")}
      for r in range(rounds):
        for variant, head in (("frozen", ["-m", "jaxdl"]), ("unfrozen", ["-c", _UNFROZEN])):
          workdir = os.path.join(tmp, f"{exp.replace(':', '_')}-{variant}-{r}")
          best[variant] = min(best[variant], _timed(
              [sys.executable, *head, "train", exp, "--workdir", workdir, "--no-progress",
               "--set", "train.plot=False"]))
      out[exp] = {**best, "ratio": best["frozen"] / best["unfrozen"]}
  return out
