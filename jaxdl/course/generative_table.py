"""The course's generative-model table, measured: calls, time, bits/dim, quality and failure of
five families on the 2-D moons toy and on 8x8 digits (generative_table's procedure).

`build_table(config, workdir, configs=...)` takes the run in `workdir` as the moons flow
(fm_toy2d's config, the table's own training run) and trains every other row's experiment
through the engine into <workdir>/<row> (a finished run there is reused), each at its smoke size
when `config.smoke`; the caller (the experiment's `after_training`) loads those configs, the
experiment specs and overrides of `row_specs(config)`:
ddpm_toy2d and gan_toy2d on moons, gan_toy2d on 8 Gaussians (its modes covered: the mode-collapse
column), vae_digits, gan_digits (the classes its samples fall in: the same column on digits),
fm_digits_cfg, ddpm_digits_cfg and ar_digits; the moons flow is reflowed and
distilled to one step (`jaxdl.generative.few_step`, reflow_toy2d's and distill_toy2d's configs).
The digits rows are judged by a digits_cnn run in <workdir>/classifier
(`jaxdl.course.digits_judge`). `config.table` sets the sizes (see the experiment's docstring for
the columns). Writes table.json, table.md and samples.npz; `families_figure` draws samples.npz
(the course notebook's figure of the families side by side).

Shapes: N samples, D data dims.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from typing import ClassVar

import jax
import numpy as np

from jaxdl.generative.settings import parse_gen
from jaxdl.schema import POSITIVE, Settings, parse_section, setting

# row, data, family, experiment, overrides; the moons flow ('toy_fm') is the table's own run.
RUNS = (
    ("toy_ddpm", "toy", "diffusion", "ddpm_toy2d", ()),
    ("toy_gan", "toy", "GAN", "gan_toy2d", ("data.distribution='moons'",)),
    ("toy_gan_8g", None, "GAN", "gan_toy2d", ()),
    ("digits_vae", "digits", "VAE", "vae_digits", ()),
    ("digits_gan", "digits", "GAN", "gan_digits", ()),
    ("digits_fm", "digits", "flow matching", "fm_digits_cfg", ()),
    ("digits_ddpm", "digits", "diffusion", "ddpm_digits_cfg", ()),
    ("digits_ar", "digits", "autoregressive", "ar_digits", ()),
)


@dataclasses.dataclass(frozen=True)
class TableSettings(Settings):
  """The `table` section: how many samples and evaluation steps each row's columns take."""
  prefix: ClassVar[str] = "table."

  num: int = setting(500, POSITIVE)        # digits drawn per row (time, quality, judge)
  toy_num: int = setting(2000, POSITIVE)   # toy points drawn per row
  rounds: int = setting(16, POSITIVE)      # toy quality: energy distance over this many draws
  ll_num: int = setting(360, POSITIVE)     # points whose PF-ODE bits/dim are averaged
  ll_steps: int = setting(100, POSITIVE)   # the PF-ODE's steps
  timed_calls: int = setting(3, POSITIVE)  # seconds/sample: the best of this many timed calls


def parse_table(config) -> TableSettings:
  """config.table, checked (a bad key or value is one line, before anything trains)."""
  return parse_section(config.get("table"), TableSettings)


def best_time(fn, *args, calls: int = 3):
  """(best of `calls` wall times of a compiled call after one warm-up call, the last call's
  output). A sampler's calls with one key draw the same samples, so the row keeps that output
  instead of drawing them once more."""
  out = jax.block_until_ready(fn(*args))
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return min(times), out


# The table's own `train` settings that every row's run takes too: what a run computes and writes
# beside its training (loss plot, trackers, health signals, FLOP counts); `--set train.plot=False`
# on the table turns off every row's loss plot.
SHARED_TRAIN_KEYS = ("plot", "loggers", "watch", "count_flops")


def row_specs(table_config) -> dict[str, tuple[str, list[str]]]:
  """{key: (experiment spec, overrides)} of the configs `build_table` needs: every row of `RUNS`
  (at its smoke size when the table's is, with the table's `SHARED_TRAIN_KEYS`) and the few-step
  rows' 'reflow_toy2d' and 'distill_toy2d'."""
  size = ":smoke" if table_config.smoke else ""
  shared = [f"train.{key}={table_config.train[key]!r}" for key in SHARED_TRAIN_KEYS]
  out = {name: (spec + size, [*overrides, *shared]) for name, _, _, spec, overrides in RUNS}
  out.update({f"{v}_toy2d": (f"{v}_toy2d{size}", []) for v in ("reflow", "distill")})
  return out


def _train(config, workdir):
  """(config, model, variables) of a row's config trained into `workdir` (reused if done)."""
  from jaxdl.train import load_run
  from jaxdl.train import run as train_run
  train_run(config, workdir, progress=False)
  _, model, variables, _ = load_run(workdir, config)
  return config, model, variables


def _sampler(family, config, model, *, sampler=None, steps=None):
  """(sample(variables, rng, num, y=None), network calls per sample) of a trained run."""
  from jaxdl.generative import gan, tasks, vae
  if family in ("VAE", "GAN"):
    one = (vae if family == "VAE" else gan).make_run_sampler(config, model)
    return (lambda v, rng, num, y=None: one(v, rng, num)), 1
  gen = config.gen
  sampler, steps = sampler or gen.sampler, int(steps or gen.steps)
  sample = tasks.make_run_sampler(config, model, sampler=sampler, steps=steps)
  return sample, steps * (2 if sampler == "heun" else 1) * (2 if gen.guidance else 1)


def _toy_quality(sample, variables, config, num, rounds):
  from jaxdl.data import sample_toy2d
  from jaxdl.generative import metrics
  dist = config.data.distribution
  d, floor = [], []
  for r in range(rounds):
    a, b = sample_toy2d(dist, num, 10_000 + 2 * r), sample_toy2d(dist, num, 10_001 + 2 * r)
    d.append(metrics.energy_distance(np.asarray(sample(variables, jax.random.PRNGKey(r), num)), a))
    floor.append(metrics.energy_distance(b, a))
  return {"energy": float(np.mean(d)), "floor": float(np.mean(floor)),
          "energy_ratio": float(np.mean(d) / np.mean(floor))}


def _pf_ode_bpd(config, model, variables, x, y, steps, divergence):
  """-log2 p(x) / D by the probability-flow ODE, averaged over x."""
  from jaxdl.generative import likelihood
  res = likelihood.run_log_likelihood(config, model, variables, x, steps=steps,
                                      divergence=divergence, probes=1, rng=jax.random.PRNGKey(7),
                                      y=y)
  return float(np.mean(np.asarray(res["bpd"])))


def _ar_row(model, variables, labels, t):
  """calls, seconds/sample, bits/dim and pixels of the AR run's samples."""
  from jaxdl.course import autoregressive_digits as ar
  from jaxdl.data import digit_tokens
  params, sample = variables["params"], ar.digit_sampler(model)
  seconds, tokens = best_time(lambda: sample(params, labels), calls=t.timed_calls)
  pix = digit_tokens.dequantize(tokens)
  seconds /= t.num
  exact = ar.bits_per_dim(model, params, *digit_tokens.split_sequences()[1])
  return {"calls": digit_tokens.PIXELS, "bits_per_dim": exact, "seconds_per_sample": seconds,
          "bits_per_dim_kind": "exact (discrete, 16 levels)",
          "bits_per_dim_dequantized": exact + math.log2(17 / 128)}, pix


def _digits_row(row, family, config, model, variables, judge, t):
  """calls, seconds/sample, bits/dim, quality (and the VAE's active units) of a digits run."""
  from jaxdl.data.sources import digits_split
  from jaxdl.generative import evaluation, vae
  labels = np.arange(t.num) % 10
  if family == "autoregressive":
    out, pix = _ar_row(model, variables, labels, t)
  else:
    conditional = bool(parse_gen(config).num_classes)
    sample, calls = _sampler(family, config, model)
    y = labels if conditional else None
    key = jax.random.PRNGKey(0)
    seconds, drawn = best_time(lambda: sample(variables, key, t.num, y=y), calls=t.timed_calls)
    out = {"calls": calls, "seconds_per_sample": seconds / t.num}
    pix = evaluation._to_pixels16(drawn, config.data.scale)  # noqa: SLF001
    _, _, x_te, y_te = digits_split()
    x = (x_te[:t.ll_num] / 8.0 - 1.0)[..., None].astype(np.float32)  # the [-1, 1] scale
    # Uniformly dequantized: each of the 17 levels spread over its bin of width 1/8.
    x_deq = x + np.random.default_rng(5).uniform(-1 / 16, 1 / 16, x.shape).astype(np.float32)
    if family == "GAN":  # no likelihood; its failure is the classes it never draws
      out["classes_drawn"] = int(len(np.unique(judge(pix)[0].argmax(-1))))
    elif family == "VAE":
      summary = json.loads(pathlib.Path(row, "summary.json").read_text())
      out.update(bits_per_dim=summary["eval"]["bpd"], bits_per_dim_kind="bound (-ELBO)",
                 bits_per_dim_dequantized=vae.run_elbo(model, variables, x_deq)["bpd"],
                 active_units=summary["eval"].get("active_units"))
    else:
      y_ll = y_te[:t.ll_num] if conditional else None
      out.update(bits_per_dim=_pf_ode_bpd(config, model, variables, x, y_ll, t.ll_steps,
                                          "hutchinson"),
                 bits_per_dim_dequantized=_pf_ode_bpd(config, model, variables, x_deq, y_ll,
                                                      t.ll_steps, "hutchinson"),
                 bits_per_dim_kind="PF-ODE (Hutchinson, 1 probe)")
    labels = y
  out["quality"] = evaluation.digits_quality(judge, pix, labels)
  return out, pix


def _toy_row(family, config, model, variables, t, *, sampler=None, steps=None):
  sample, calls = _sampler(family, config, model, sampler=sampler, steps=steps)
  key = jax.random.PRNGKey(0)
  seconds, drawn = best_time(lambda: sample(variables, key, t.toy_num), calls=t.timed_calls)
  out = {"calls": calls, "seconds_per_sample": seconds / t.toy_num,
         "quality": _toy_quality(sample, variables, config, t.toy_num, t.rounds)}
  if family in ("flow matching", "diffusion"):
    from jaxdl.data import sample_toy2d
    x = sample_toy2d(config.data.distribution, t.ll_num, 20_000).astype(np.float32)
    out.update(bits_per_dim=_pf_ode_bpd(config, model, variables, x, None, t.ll_steps, "exact"),
               bits_per_dim_kind="PF-ODE (exact divergence)")
  return out, np.asarray(drawn)


def _few_step_rows(config, model, variables, t, rows, samples, configs):
  """The moons flow reflowed and distilled to one Euler step (reflow_toy2d's and
  distill_toy2d's configs, `configs[...]`, at the table's size)."""
  from jaxdl.generative import few_step
  reflowed = few_step.reflow_student(configs["reflow_toy2d"], model, variables)
  distilled = few_step.distill_students(configs["distill_toy2d"], model, variables,
                                        student_steps=(1,))[1]
  for variant, (params, _) in (("reflow", reflowed), ("distill", distilled)):
    key = f"toy_fm_{variant}"
    rows[key], samples[key] = _toy_row("flow matching", config, model, {"params": params}, t,
                                       sampler="euler", steps=1)
    rows[key].update(data="toy", family=f"flow matching + {variant}",
                     experiment=f"{variant}_toy2d")


def build_table(config, workdir, summary=None, *, configs) -> dict:
  """Trains or loads every row, measures it, writes table.json / table.md / samples.npz;
  returns {'table': path, 'rows': count}. `configs`: {key: config} of every key of
  `row_specs(config)`."""
  from jaxdl.course import digits_judge
  from jaxdl.generative import mode_coverage
  from jaxdl.train import load_run
  del summary
  workdir = pathlib.Path(workdir)
  t = parse_table(config)
  judge = digits_judge.judge_outputs(workdir, config.smoke)
  _, model, variables, _ = load_run(workdir, config)
  rows, samples = {}, {}
  rows["toy_fm"], samples["toy_fm"] = _toy_row("flow matching", config, model, variables, t)
  rows["toy_fm"].update(data="toy", family="flow matching", experiment="fm_toy2d")
  _few_step_rows(config, model, variables, t, rows, samples, configs)
  for name, data, family, spec, _ in RUNS:
    cfg, m, v = _train(configs[name], workdir / name)
    if data is None:  # the mode-collapse run: modes covered on 8 Gaussians
      sample, _ = _sampler(family, cfg, m)
      x = np.asarray(sample(v, jax.random.PRNGKey(0), t.toy_num))
      rows["toy_gan"]["modes_covered"] = mode_coverage.modes_of_8gaussians(x)["covered"]
      continue
    if data == "digits":
      rows[name], samples[name] = _digits_row(workdir / name, family, cfg, m, v, judge, t)
    else:
      rows[name], samples[name] = _toy_row(family, cfg, m, v, t)
    rows[name].update(data=data, family=family, experiment=spec)
  for row in rows.values():
    ref = rows["digits_vae" if row["data"] == "digits" else "toy_gan"]
    row["time_ratio"] = row["seconds_per_sample"] / ref["seconds_per_sample"]
  (workdir / "table.json").write_text(json.dumps(rows, indent=2))
  (workdir / "table.md").write_text(markdown(rows))
  np.savez(workdir / "samples.npz", **samples)
  print(markdown(rows))
  return {"table": str(workdir / "table.md"), "rows": len(rows)}


def markdown(rows) -> str:
  """The table as markdown, one line per (data, family)."""
  lines = ["| data | family | calls | ms/sample (ratio) | bits/dim | quality | failure |",
           "|---|---|---|---|---|---|---|"]
  for row in rows.values():
    bpd = row.get("bits_per_dim")
    bpd = "none" if bpd is None else f"{bpd:.3f} {row['bits_per_dim_kind']}"
    if "bits_per_dim_dequantized" in row:
      bpd += f" [{row['bits_per_dim_dequantized']:.3f}]"
    q = row["quality"]
    if row["data"] == "toy":
      quality = f"ED {q['energy_ratio']:.2f}x floor"
    else:
      quality = (f"{100 * q['confident']:.0f}% >= 0.9; FD {q['frechet']:.1f} "
                 f"(floor {q['frechet_floor']:.1f})")
    failure = ""
    if "active_units" in row:
      failure = f"active units {row['active_units']:.0f}"
    if "modes_covered" in row:
      failure = f"modes covered {row['modes_covered']}/8 (8 Gaussians)"
    if "classes_drawn" in row:
      failure = f"classes drawn {row['classes_drawn']}/10"
    lines.append(f"| {row['data']} | {row['family']} | {row['calls']} | "
                 f"{1e3 * row['seconds_per_sample']:.3f} ({row['time_ratio']:.1f}x) | {bpd} | "
                 f"{quality} | {failure} |")
  return "\n".join(lines) + "\n"


def families_figure(samples, path=None):
  """The families side by side, from a samples.npz mapping: a scatter panel per 'toy_*' row
  ((N, 2) points) on top, then one row of digits per 'digits_*' row (its first ten samples,
  classes 0-9 where conditional; (N, 64) pixels 0..16), every family in the mapping's order.
  Digits keep their aspect: square 8x8 cells with a one-pixel gap, the figure sized from the
  rows and columns so nothing is stretched. Saved to `path` when given.

  Returns (figure, toy labels, digit labels): the labels drawn, the keys without their prefix.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  toy = [k for k in samples if k.startswith("toy")]
  digits = [k for k in samples if k.startswith("digits")]
  cols, cell, gap = 10, 8, 1
  step = cell + gap
  grid = np.zeros((len(digits) * step + gap, cols * step + gap), np.float32)  # 0: white
  for r, k in enumerate(digits):
    for c, img in enumerate(np.asarray(samples[k])[:cols].reshape(-1, cell, cell)):
      grid[gap + r * step:gap + r * step + cell, gap + c * step:gap + c * step + cell] = img
  panel, label_w = 1.6, 0.8                      # inches: a toy panel; the row labels' margin
  width = max(panel * max(len(toy), 1), 5.0)
  grid_h = (width - label_w) * grid.shape[0] / grid.shape[1]  # square pixels at full width
  heights = ([panel] if toy else []) + ([grid_h] if digits else [])
  fig = plt.figure(figsize=(width, sum(heights) + 0.4 * len(heights)))
  gs = matplotlib.gridspec.GridSpec(len(heights), 1, figure=fig, height_ratios=heights)
  if toy:
    top = gs[0].subgridspec(1, len(toy))
    for i, k in enumerate(toy):
      a = fig.add_subplot(top[i])
      a.scatter(samples[k][:, 0], samples[k][:, 1], s=0.5)
      a.set(title=k[4:], xlim=(-3, 3), ylim=(-3, 3), xticks=[], yticks=[], aspect="equal")
  if digits:
    a = fig.add_subplot(gs[-1])
    a.imshow(grid, cmap="gray_r", vmin=0, vmax=16, aspect="equal", interpolation="nearest")
    a.set(yticks=gap + cell / 2 - 0.5 + step * np.arange(len(digits)),
          yticklabels=[k[7:] for k in digits], xticks=[])
  fig.tight_layout()
  if path is not None:
    fig.savefig(path, dpi=60, bbox_inches="tight")
  return fig, [k[4:] for k in toy], [k[7:] for k in digits]
