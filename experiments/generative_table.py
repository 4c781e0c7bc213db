"""The course's generative-model table, measured: five families on one 2-D toy and on 8x8 digits.

Run:
  jaxdl train experiments/generative_table.py   # workdir runs/generative_table
  jaxdl train generative_table:smoke            # every run at its smoke size, for tests

Setup: each family is its own experiment, trained through the engine into <workdir>/<row>
(a finished run there is reused; copy a workdir in to skip its training): moons with fm_toy2d,
ddpm_toy2d and gan_toy2d (data.distribution=moons), the fm_toy2d run reflowed
(reflow_toy2d's student) and step-distilled (distill_toy2d's 1-step student); digits with
vae_digits, fm_digits_cfg, ddpm_digits_cfg and ar_digits. Failures where the course names one:
posterior collapse (the VAE's active latent units, of its 2) and mode collapse (gan_toy2d at
its default config on 8 Gaussians: modes covered of 8). Columns:
- calls: network calls per sample (Heun: 2 per step; classifier-free guidance doubles them);
- ms/sample and its ratio to the one-call family of the same data (VAE on digits, GAN on the
  toy): the best of 3 timed calls of the jitted sampler on `table.num` samples after a warm-up;
- bits/dim: AR exact (discrete, 16 levels); VAE the negative ELBO (a bound); flow / diffusion
  the PF-ODE (`likelihood.run_log_likelihood`, `table.ll_steps` steps, exact divergence on the
  toy, Hutchinson with one probe on digits; conditional runs: log p(x | class)) on fresh toy
  points / the test digits; GAN none. On digits the continuous models are evaluated at the
  17-level lattice points they were trained on, where a density can grow without bound, so the
  brackets give the like-for-like figure, the density of uniformly dequantized test digits on
  the [-1, 1] pixel scale: each level spread over its bin of width 1/8 (one fixed draw) for the
  VAE, flow and diffusion; for the AR, whose 16 levels have bins of 17/128, 'exact +
  log2(17/128)' per pixel (its density is constant on each bin);
- quality: toy, energy distance over the two-draw floor (fresh target points, `table.rounds`
  rounds); digits, the fraction of samples a digits_cnn run labels with >= 0.9 confidence (as
  their class, for the class-conditional families) and the Frechet distance of its penultimate
  features, beside the real-vs-real floor (`evaluation.digits_quality`).
Writes table.json and table.md.

Expected: the families ordered as the course's table says.
Measured (default configs, seed 0, one run each; `runs/generative_table/table.md`; ms per
sample on the 2-core CPU shared with one other job, ratio to the one-call family of the same
data; a second such run gave ratios within 25% of these):

| data | family | calls | ms/sample (ratio) | bits/dim | quality | failure |
|---|---|---|---|---|---|---|
| toy | flow matching | 100 | 0.308 (1030x) | 1.286 PF-ODE | ED 1.08x floor | |
| toy | + reflow | 1 | 0.003 (11.6x) | 1.288 PF-ODE | ED 1.08x floor | |
| toy | + distill | 1 | 0.003 (10.7x) | 1.624 PF-ODE | ED 1.09x floor | |
| toy | diffusion | 50 | 0.154 (516x) | 1.312 PF-ODE | ED 1.15x floor | |
| toy | GAN | 1 | 0.0003 (1x) | none | ED 2.68x floor | 8/8 modes |
| digits | VAE | 1 | 0.001 (1x) | 0.222 bound [0.256] | 90%; FD 31.1 | 2 / 2 active |
| digits | flow matching | 100 | 8.36 (7433x) | -2.264 PF-ODE [-0.724] | 100%; FD 9.7 | |
| digits | diffusion | 100 | 7.05 (6267x) | -1.552 PF-ODE [-0.401] | 99.8%; FD 7.3 | |
| digits | autoregressive | 64 | 5.41 (4807x) | 2.384 exact [-0.528] | 97.4%; FD 4.5 | |

Toy: energy distance over the floor 1.91e-3 (2,000 points, 16 rounds; one round of the floor
alone ranges about 3x, so 1.08-1.15x is at the floor). Digits: 500 samples labelled with
confidence >= 0.9 (as their class where conditional), Frechet distance with floor 5.8.
What it shows, family by family: the iterative samplers (flow, diffusion, AR) cost 500-7,000x
the one-call families per sample, and reflow or distillation brings the flow to one call at the
same energy distance; the GAN samples in one call but sits furthest from the toy (2.7x the floor;
its collapse config covers 2/8 modes, see gan_toy2d); the VAE's samples are the blurriest by
Frechet distance (31 vs 4.5-9.7) while still mostly recognizable; AR is the only exact discrete
likelihood. At the lattice points the flow's -2.26 shows a density concentrated on the
lattice; on dequantized digits (the brackets, like for like) the flow is best at -0.72, then the
AR -0.53, diffusion -0.40 and the VAE's bound 0.26 (the AR's bins are 17/128 wide, the others'
1/8). The distilled one-step map samples as well as the reflowed one but is a different map with
a worse PF-ODE likelihood (1.62 vs 1.29 bits/dim): distillation matches endpoints, not the flow.
Full run: about 26 min on the 2-core CPU shared with other jobs (ar_digits' 3,000 steps take 15
of them); the measuring alone, with every run reused, about 8 min. The smoke table (`:smoke`,
every run a few steps old) shows the columns, not the families' quality.
"""

import json
import math
import pathlib
import time

import ar_digits
import jax
import ml_collections
import numpy as np
from _digits import train_classifier
from distill_toy2d import distill_students
from gan_toy2d import mode_centres
from reflow_toy2d import reflow_student

from jaxdl.config import load_config, parse_arg

# row, data, family, experiment, overrides
RUNS = (
    ("toy_fm", "toy", "flow matching", "fm_toy2d", ()),
    ("toy_ddpm", "toy", "diffusion", "ddpm_toy2d", ()),
    ("toy_gan", "toy", "GAN", "gan_toy2d", ("data.distribution='moons'",)),
    ("toy_gan_8g", None, "GAN", "gan_toy2d", ()),
    ("digits_vae", "digits", "VAE", "vae_digits", ()),
    ("digits_fm", "digits", "flow matching", "fm_digits_cfg", ()),
    ("digits_ddpm", "digits", "diffusion", "ddpm_digits_cfg", ()),
    ("digits_ar", "digits", "autoregressive", "ar_digits", ()),
)


def get_config(arg=None):
  smoke = parse_arg(arg, smoke=False).smoke
  c = ml_collections.ConfigDict()
  c.name = "generative_table"
  c.description = "The generative-model table: calls, time, bits/dim, quality, failure per family"
  c.seed = 0
  c.smoke = smoke
  c.table = dict(num=64 if smoke else 500, toy_num=300 if smoke else 2000,
                 rounds=2 if smoke else 16, ll_num=64 if smoke else 360,
                 ll_steps=8 if smoke else 100, classifier="digits_cnn:smoke" if smoke else
                 "digits_cnn")
  return c


def _best_time(fn, *args):
  """Best of 3 wall times of a compiled call (after one warm-up call)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(3):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return min(times)


def _train(spec, overrides, smoke, workdir):
  from jaxdl.train import load_run
  from jaxdl.train import run as train_run
  config, _ = load_config(spec + (":smoke" if smoke else ""), list(overrides))
  if spec == "ar_digits":
    model, params, _, _, test_xy = ar_digits.train(config, workdir)
    return config, model, {"params": params}, test_xy
  train_run(config, workdir, progress=False)
  _, model, variables, _ = load_run(workdir, config)
  return config, model, variables, None


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


def _digits_row(row, family, config, model, variables, test_xy, judge, t):
  """calls, seconds/sample, bits/dim, quality (and the VAE's active units) of a digits run."""
  from jaxdl.data.sources import digits_split
  from jaxdl.generative import evaluation, vae
  labels = np.arange(t.num) % ar_digits.CLASSES
  if family == "autoregressive":
    params, sample = variables["params"], ar_digits.digit_sampler(model)
    seconds = _best_time(lambda: sample(params, labels)) / t.num
    pix = ar_digits.dequantize(sample(params, labels))
    exact = ar_digits.bits_per_dim(model, params, *test_xy)
    out = {"calls": ar_digits.PIXELS, "bits_per_dim": exact,
           "bits_per_dim_kind": "exact (discrete, 16 levels)",
           "bits_per_dim_dequantized": exact + math.log2(17 / 128)}
  else:
    conditional = bool(config.gen.get("num_classes", 0))
    sample, calls = _sampler(family, config, model)
    y = labels if conditional else None
    key = jax.random.PRNGKey(0)
    seconds = _best_time(lambda: sample(variables, key, t.num, y=y)) / t.num
    pix = evaluation._to_pixels16(sample(variables, key, t.num, y=y),  # noqa: SLF001
                                  config.data.scale)
    out = {"calls": calls}
    _, _, x_te, y_te = digits_split()
    x = (x_te[:t.ll_num] / 8.0 - 1.0)[..., None].astype(np.float32)  # the [-1, 1] scale
    # Uniformly dequantized: each of the 17 levels spread over its bin of width 1/8.
    x_deq = x + np.random.default_rng(5).uniform(-1 / 16, 1 / 16, x.shape).astype(np.float32)
    if family == "VAE":
      summary = json.loads(pathlib.Path(row, "summary.json").read_text())
      out.update(bits_per_dim=summary["eval"]["bpd"], bits_per_dim_kind="bound (-ELBO)",
                 bits_per_dim_dequantized=vae.run_elbo(config, model, variables, x_deq)["bpd"],
                 active_units=summary["eval"].get("active_units"))
    else:
      y_ll = y_te[:t.ll_num] if conditional else None
      out.update(bits_per_dim=_pf_ode_bpd(config, model, variables, x, y_ll, t.ll_steps,
                                          "hutchinson"),
                 bits_per_dim_dequantized=_pf_ode_bpd(config, model, variables, x_deq, y_ll,
                                                      t.ll_steps, "hutchinson"),
                 bits_per_dim_kind="PF-ODE (Hutchinson, 1 probe)")
    labels = y
  out["seconds_per_sample"] = seconds
  out["quality"] = evaluation.digits_quality(judge, pix, labels)
  return out, pix


def _toy_row(family, config, model, variables, t, *, sampler=None, steps=None):
  sample, calls = _sampler(family, config, model, sampler=sampler, steps=steps)
  key = jax.random.PRNGKey(0)
  out = {"calls": calls,
         "seconds_per_sample": _best_time(lambda: sample(variables, key, t.toy_num)) / t.toy_num,
         "quality": _toy_quality(sample, variables, config, t.toy_num, t.rounds)}
  if family in ("flow matching", "diffusion"):
    from jaxdl.data import sample_toy2d
    x = sample_toy2d(config.data.distribution, t.ll_num, 20_000).astype(np.float32)
    out.update(bits_per_dim=_pf_ode_bpd(config, model, variables, x, None, t.ll_steps, "exact"),
               bits_per_dim_kind="PF-ODE (exact divergence)")
  return out, np.asarray(sample(variables, key, t.toy_num))


def run(config, workdir):
  """Trains or loads every run, measures it, writes table.json / table.md, returns the table."""
  from jaxdl.generative import evaluation, gan
  workdir = pathlib.Path(workdir)
  t = config.table
  judge = evaluation.classifier_outputs(train_classifier(workdir, t.classifier))
  rows, samples = {}, {}
  for name, data, family, spec, overrides in RUNS:
    row_dir = workdir / name
    cfg, model, variables, test_xy = _train(spec, overrides, config.smoke, row_dir)
    if data is None:  # the mode-collapse run: modes covered on 8 Gaussians
      sample, _ = _sampler(family, cfg, model)
      x = np.asarray(sample(variables, jax.random.PRNGKey(0), t.toy_num))
      centres, mean_dist = mode_centres()
      rows["toy_gan"]["modes_covered"] = gan.modes_covered(
          x, centres, radius=3 * mean_dist / np.sqrt(np.pi / 2))["covered"]
      continue
    if data == "digits":
      rows[name], samples[name] = _digits_row(row_dir, family, cfg, model, variables, test_xy,
                                              judge, t)
    else:
      rows[name], samples[name] = _toy_row(family, cfg, model, variables, t)
    rows[name].update(data=data, family=family, experiment=spec)
    if name == "toy_fm":  # few-step variants of the same flow: reflowed and distilled, 1 step
      reflow_cfg, _ = load_config("reflow_toy2d" + (":smoke" if config.smoke else ""))
      distill_cfg, _ = load_config("distill_toy2d" + (":smoke" if config.smoke else ""))
      distill_cfg.distill.student_steps = (1,)
      for variant, params in (("reflow", reflow_student(reflow_cfg, model, variables)[0]),
                              ("distill", distill_students(distill_cfg, model,
                                                           variables)[1][0])):
        key = f"toy_fm_{variant}"
        rows[key], samples[key] = _toy_row(family, cfg, model, {"params": params}, t,
                                           sampler="euler", steps=1)
        rows[key].update(data="toy", family=f"flow matching + {variant}",
                         experiment=f"{variant}_toy2d")
  for name, row in rows.items():
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
    lines.append(f"| {row['data']} | {row['family']} | {row['calls']} | "
                 f"{1e3 * row['seconds_per_sample']:.3f} ({row['time_ratio']:.1f}x) | {bpd} | "
                 f"{quality} | {failure} |")
  return "\n".join(lines) + "\n"
