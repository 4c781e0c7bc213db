"""Sample quality against the number of network calls: one trained class-conditional digits run,
every applicable sampler, several step counts (`jaxdl nfe WORKDIR --steps 4,8,16,32`).

`sweep(workdir, steps_list, outputs, ...)` draws `per_class` samples of each of the K classes
(the run's guidance, the same seed and so the same starting noise for every cell) for each
sampler s and step count N, and judges them with `outputs`, the digits judge's
f(pixels16_Nx64) -> (probs_NxK, features_NxH) (`evaluation.digits_quality`):
  frechet    the Frechet distance between the judge's penultimate features of the samples and of
             as many real digits; frechet_floor, the same between two sets of real digits, is
             what a perfect model would still get;
  confident  the fraction whose top class is the conditioning class with probability >= 0.9.
The judge is chosen (and trained if need be) by `jaxdl.course.sampler_table`.

Network calls of N steps of each rule (its registry entry's `calls`, `samplers.network_calls`),
one call = one batched evaluation:
  ddpm, ddim, euler, dpmpp_2m, dpmpp_3m   N
  heun                                    2N   (the correction at every step)
  edm_heun                                N + the steps with Heun's correction: not the last
                                          step to sigma = 0, nor a step from pure noise
                                          (2N - 1 on EDM, 2N - 2 on the flow and DDPM)
Classifier-free guidance evaluates the network on (x, y) and (x, null) in one batch of 2B:
`calls` counts the sequential batched calls (what latency follows), `nfe` = 2 x calls under
guidance the network evaluations per sample (what compute follows; the figure's x axis).

Skipped, with the reason in the table's 'skipped' (steps None: at every step count): a sampler
the run's path refuses (`make_sampler`'s one-line message: euler and heun on DDPM, heun on EDM),
and a step count below a solver's order (dpmpp_3m at N = 2).

Writes nfe_sweep.json (the table) and nfe_sweep.png (frechet and confident vs nfe, log x, one
line per sampler) into `out_dir`.

Measured (`jaxdl train fm_digits_cfg` to step 3000, its judge a digits_cnn run at test accuracy
0.994; `jaxdl nfe WORKDIR --steps 4,8,16,32,64`, 100 samples per class, guidance w = 2,
so NFE = 2 x calls; Frechet distance, real-vs-real floor 2.81; the confident fraction was 0.999 to
1.000 in every cell):

  sampler    N=4          N=8          N=16         N=32         N=64
  ddpm       14.20 @ 8    10.19 @ 16   8.25 @ 32    6.96 @ 64    6.15 @ 128
  ddim       12.83 @ 8    10.07 @ 16   8.79 @ 32    8.09 @ 64    7.74 @ 128
  euler      12.83 @ 8    10.07 @ 16   8.79 @ 32    8.09 @ 64    7.74 @ 128
  heun        5.68 @ 16    6.86 @ 32   7.24 @ 64    7.35 @ 128   7.37 @ 256
  dpmpp_2m    9.57 @ 8     7.14 @ 16   7.40 @ 32    7.47 @ 64    7.40 @ 128
  edm_heun    5.56 @ 12    6.56 @ 28   7.31 @ 60    7.40 @ 124   7.38 @ 252

DDIM is Euler on the flow (same numbers). The second-order ODE solvers reach the ODE's own limit
(~7.4) by NFE 32-60, DPM-Solver++(2M) by NFE 16, Euler is still 5% above it at 128; at the
fewest calls Heun and EDM-Heun score *below* that limit (5.6), i.e. their discretization error
happens to move samples towards the data here: a lower distance is not a more exact ODE solve.
Ancestral sampling converges to another, lower distance (6.15 at 128, still falling).

The same sweep on `jaxdl train ddpm_digits_cfg`'s trained run (cosine DDPM, its judge a
digits_cnn run at 0.994; 50 samples per class, w = 2, real-vs-real floor 5.84; Euler and Heun
refused on the discrete path; the confident fraction 0.998 to 1.000 in every cell; 2026-12-02):

  sampler    N=4          N=8          N=16         N=32         N=64
  ddpm       10.56 @ 8    10.44 @ 16   10.37 @ 32   9.57 @ 64    8.54 @ 128
  ddim        7.22 @ 8     6.38 @ 16   6.18 @ 32    6.01 @ 64    5.97 @ 128
  dpmpp_2m    6.82 @ 8     5.71 @ 16   5.84 @ 32    5.87 @ 64    5.90 @ 128
  edm_heun    6.07 @ 12    5.69 @ 28   5.97 @ 60    5.89 @ 124   5.91 @ 252

DPM-Solver++(2M) and EDM-Heun are at the ODE's limit (about 5.9) by 16-28 evaluations, DDIM by
about 128; ancestral sampling is far from converged at 128.

And on `jaxdl train edm_digits`' trained run at its guidance w = 1.5 (same judge, 50 samples per
class, floor 5.84; plain Heun refused at sigma = 0; the ancestral and DDIM rows from a first run
of the sweep, which stopped at Euler before the fix to `Grid.velocity` on this path; 2026-12-02):

  sampler    N=4          N=8          N=16         N=32         N=64
  ddpm       13.20 @ 8    11.69 @ 16   8.56 @ 32    5.91 @ 64    5.13 @ 128
  ddim       10.53 @ 8     8.33 @ 16   5.84 @ 32    4.98 @ 64    4.63 @ 128
  euler      86.90 @ 8    39.02 @ 16   7.16 @ 32    3.63 @ 64    3.67 @ 128
  dpmpp_2m    8.96 @ 8     5.18 @ 16   4.08 @ 32    4.21 @ 64    4.29 @ 128
  edm_heun   68.42 @ 14    4.72 @ 30   4.01 @ 62    4.21 @ 126   4.29 @ 254

The confident fraction is 0.99-1.00 wherever the distance is under 10 (Euler at 8 and 16
evaluations: 0.46, 0.86; EDM-Heun at 14: 0.20). Four steps of the rho = 7 Karras grid from
sigma = 80 are too coarse for the first-order rules and EDM-Heun; DPM-Solver++(2M) and EDM-Heun
reach about 4.0-4.3 by 30-60 evaluations.

Shapes: N samples, K classes, H judge features.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from jaxdl.generative import samplers as samplers_lib
from jaxdl.generative.settings import parse_gen, path_from_config

DEFAULT_SAMPLERS = ("ddpm", "ddim", "euler", "heun", "dpmpp_2m", "edm_heun")


def steps_for_calls(path, sampler: str, calls: int, **grid) -> int:
  """The fewest steps N >= the rule's order whose network calls (`samplers.network_calls`) are
  >= `calls` (equal when the rule can reach it: N for the one-call rules, calls / 2 for heun);
  `grid`: spacing, rho."""
  n = samplers_lib.SAMPLERS[sampler].order
  while samplers_lib.network_calls(path, sampler=sampler, steps=n, **grid) < calls:
    n += 1
  return n


def plan(config, model, sampler_names, steps_list) -> tuple[list, list]:
  """(cells, skipped): cells [(sampler, N, make_sampler's sample fn)] the run can sample, and
  skipped [{'sampler', 'steps', 'reason'}] (steps None when every step count is refused the
  same way: the path refuses the sampler). An unknown sampler name raises ValueError."""
  from jaxdl.generative import tasks  # pylint: disable=g-import-not-at-top
  unknown = [s for s in sampler_names if s not in samplers_lib.SAMPLERS]
  if unknown:
    raise ValueError(f"--samplers: unknown {unknown}; expected names in "
                     f"{sorted(samplers_lib.SAMPLERS)}")
  bad = [n for n in steps_list if not isinstance(n, (int, np.integer)) or n < 1]
  if bad or not steps_list:
    raise ValueError(f"--steps: expected step counts >= 1, got {list(steps_list)}")
  cells, skipped = [], []
  for name in sampler_names:
    order = samplers_lib.SAMPLERS[name].order
    reasons = {}
    for n in sorted(set(int(n) for n in steps_list)):
      if n < order:
        skipped.append(dict(sampler=name, steps=n,
                            reason=f"N = {n} is below the order {order} of {name!r}"))
        continue
      try:  # make_sampler refuses a sampler the path cannot run before anything compiles
        cells.append((name, n, tasks.make_run_sampler(config, model, sampler=name, steps=n)))
      except ValueError as e:
        reasons[n] = str(e).splitlines()[0]
    if len(set(reasons.values())) == 1 and not any(c[0] == name for c in cells):
      skipped.append(dict(sampler=name, steps=None, reason=next(iter(reasons.values()))))
    else:
      skipped += [dict(sampler=name, steps=n, reason=r) for n, r in reasons.items()]
  return cells, skipped


def sweep(workdir, steps_list, outputs, *, samplers=DEFAULT_SAMPLERS, per_class: int = 100,
          seed: int = 0, ema: bool = True, out_dir=None, judge_name: str = "given",
          log=print) -> dict:
  """The quality-vs-NFE table of the run in `workdir` (module docstring); `outputs` is the judge
  f(pixels16_Nx64) -> (probs_NxK, features_NxH). Writes nfe_sweep.json and nfe_sweep.png into
  `out_dir` (default: the workdir) and returns the table."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdl.generative import evaluation  # pylint: disable=g-import-not-at-top
  from jaxdl.train import load_run  # pylint: disable=g-import-not-at-top
  config, model, variables, step = load_run(workdir, ema=ema)
  gen = parse_gen(config)
  if config.data.get("name") != "digits" or not gen.num_classes:
    raise ValueError(f"{workdir}: the sweep needs a class-conditional digits run; this is a "
                     f"{config.task!r} run on {config.data.get('name')!r} with "
                     f"gen.num_classes = {gen.num_classes}")
  if per_class < 1:
    raise ValueError(f"--per-class: must be >= 1, got {per_class}")
  path = path_from_config(config, gen)
  cells, skipped = plan(config, model, list(samplers), steps_list)
  for s in skipped:
    log(f"skip {s['sampler']}" + (f" at {s['steps']} steps" if s["steps"] else "")
        + f": {s['reason']}")
  y_N = np.repeat(np.arange(gen.num_classes), per_class)
  guided = gen.guidance is not None
  rows, floor = [], None
  for name, n, sample in cells:
    t0 = time.perf_counter()
    x = np.asarray(sample(variables, jax.random.PRNGKey(seed), len(y_N), y=y_N))
    q = evaluation.digits_quality(outputs, evaluation._to_pixels16(x, config.data.scale), y_N,
                                  seed=seed)
    floor = q["frechet_floor"]
    calls = sample.calls
    rows.append(dict(sampler=name, steps=n, calls=calls, nfe=calls * (2 if guided else 1),
                     frechet=q["frechet"], confident=q["confident"],
                     seconds=time.perf_counter() - t0))
    log(f"{name:>9} N={n:<3} nfe={rows[-1]['nfe']:<4} frechet={q['frechet']:.3f} "
        f"confident={q['confident']:.3f}")
  table = dict(workdir=str(workdir), step=int(step), task=config.task, path=path.name,
               prediction=gen.prediction, spacing=gen.spacing, guidance=gen.guidance,
               nfe_per_call=2 if guided else 1, per_class=per_class, num=int(len(y_N)), seed=seed,
               judge=judge_name, frechet_floor=floor, rows=rows, skipped=skipped)
  out_dir = pathlib.Path(workdir if out_dir is None else out_dir)
  (out_dir / "nfe_sweep.json").write_text(json.dumps(table, indent=2))
  figure(table, out_dir / "nfe_sweep.png")
  return table


def figure(table: dict, path) -> None:
  """Frechet distance and confident fraction against NFE, log x, one line per sampler."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax_f, ax_c) = plt.subplots(1, 2, figsize=(10, 4))
  for name in dict.fromkeys(r["sampler"] for r in table["rows"]):
    rows = [r for r in table["rows"] if r["sampler"] == name]
    nfe = [r["nfe"] for r in rows]
    ax_f.plot(nfe, [r["frechet"] for r in rows], "o-", label=name)
    ax_c.plot(nfe, [r["confident"] for r in rows], "o-", label=name)
  if table["frechet_floor"] is not None:
    ax_f.axhline(table["frechet_floor"], color="k", ls="--", lw=0.8, label="real vs real")
  guided = " (guided: 2 per call)" if table["nfe_per_call"] == 2 else ""
  for ax, what in ((ax_f, "Frechet distance (judge features)"),
                   (ax_c, "confident fraction (p >= 0.9, its class)")):
    ax.set_xscale("log")
    ax.set_xlabel(f"network evaluations per sample{guided}")
    ax.set_ylabel(what)
  ax_f.set_yscale("log")
  if table["rows"]:  # the confident fraction on a scale where 0.999 and 1 are close
    ax_c.set_ylim(min(0.9, min(r["confident"] for r in table["rows"]) - 0.02), 1.005)
  ax_f.legend(fontsize=8)
  fig.suptitle(f"{table['workdir']} (step {table['step']}, {table['path']} path, "
               f"{table['num']} samples)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def markdown(table: dict) -> str:
  """The table as markdown: one row per sampler, columns the step counts (frechet / confident at
  nfe), then the skipped samplers."""
  steps = sorted({r["steps"] for r in table["rows"]})
  names = list(dict.fromkeys(r["sampler"] for r in table["rows"]))
  cell = {(r["sampler"], r["steps"]): r for r in table["rows"]}
  lines = ["| sampler | " + " | ".join(f"N={n}" for n in steps) + " |",
           "|---|" + "---|" * len(steps)]
  for name in names:
    entries = []
    for n in steps:
      r = cell.get((name, n))
      entries.append("-" if r is None else
                     f"{r['frechet']:.2f} / {r['confident']:.2f} @ {r['nfe']}")
    lines.append(f"| {name} | " + " | ".join(entries) + " |")
  lines.append(f"\nFrechet distance / confident fraction @ NFE (network evaluations per sample"
               f"{', 2 per guided call' if table['nfe_per_call'] == 2 else ''}); real-vs-real "
               f"floor {table['frechet_floor']:.2f}" if table["frechet_floor"] is not None
               else "")
  lines += [f"skipped {s['sampler']}" + (f" at N={s['steps']}" if s["steps"] else "")
            + f": {s['reason']}" for s in table["skipped"]]
  return "\n".join(lines)
