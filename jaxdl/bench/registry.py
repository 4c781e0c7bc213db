"""The benchmarks' registry (`register_bench`: name -> fn(ctx), the experiments it measures) and
the table row every benchmark returns (`_row`); the benchmarks are in `jaxdl.bench.benches`, the
runner in `jaxdl.bench`.
"""

from __future__ import annotations

from typing import Callable

# name -> fn(ctx) -> (raw result dict, table rows), in the order they run. `ctx` is shared by
# the benches of one run: 'setup' (the GPT setup), 'on_gpu', 'step_s' (the train step's
# seconds, set by the gpt bench and reused by the data bench) and 'dataloader' (set by the data
# bench, so data_bpe does not time the DataLoader again), 'configs' ({spec: config} of the
# experiments the benches measure, `EXPERIMENTS`).
REGISTRY: dict[str, Callable[[dict], tuple[dict, list[dict]]]] = {}
# name -> the specs of the experiment configs the benchmark measures, `ctx['configs'][spec]`.
EXPERIMENTS: dict[str, tuple[str, ...]] = {}


def register_bench(name: str, experiments: tuple[str, ...] = ()):
  """Registers `fn(ctx) -> (results, rows)` as the benchmark `name`; `experiments`: the specs of
  the experiment configs it measures, which the caller loads (`jaxdl bench`) into
  `ctx['configs']`: a benchmark loads no experiment by name."""

  def wrap(fn):
    REGISTRY[name] = fn
    EXPERIMENTS[name] = tuple(experiments)
    return fn

  return wrap


def experiments_of(names: list[str]) -> list[str]:
  """The experiment specs whose configs the benchmarks `names` measure (`run_benches`)."""
  return sorted({spec for name in names for spec in EXPERIMENTS[name]})


def _row(bench, measure, jaxdl, baseline, ratio, target, met, unit=""):
  return dict(bench=bench, measure=measure, jaxdl=jaxdl, baseline=baseline, ratio=ratio,
              target=target, met=met, unit=unit)
