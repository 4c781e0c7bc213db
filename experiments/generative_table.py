"""The course's generative-model table, measured: five families on one 2-D toy and on 8x8 digits.

Run:
  jaxdl train experiments/generative_table.py   # workdir runs/generative_table
  jaxdl train generative_table:smoke            # every run at its smoke size, for tests

Setup: the table's own training run, in <workdir>, is the moons flow (fm_toy2d's config;
`--set` overrides apply to it, and its train.plot, train.loggers, train.watch and
train.count_flops to every row's run too).
After it, `jaxdl.course.generative_table.build_table` trains each other family's experiment
through the engine into <workdir>/<row> (a finished run there is reused; copy a workdir in to
skip its training): ddpm_toy2d and gan_toy2d on moons
(data.distribution=moons), the moons flow reflowed (reflow_toy2d's student) and step-distilled
(distill_toy2d's 1-step student); digits with vae_digits, fm_digits_cfg, ddpm_digits_cfg and
ar_digits, judged by a digits_cnn run in <workdir>/classifier. (Before issue 24 the moons flow
was trained into <workdir>/toy_fm and ar_digits' GPT into <workdir>/digits_ar/gpt; the configs,
and so the numbers below, are the same.) Failures where the course names one:
posterior collapse (the VAE's active latent units, of its 2) and mode collapse (gan_toy2d at
its default config on 8 Gaussians: modes covered of 8). Columns:
- calls: network calls per sample (Heun: 2 per step; classifier-free guidance doubles them);
- ms/sample and its ratio to the one-call family of the same data (VAE on digits, GAN on the
  toy): the best of `table.timed_calls` (3) timed calls of the jitted sampler on `table.num`
  samples after a warm-up (whose samples the row keeps);
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
| digits | GAN | 1 | 0.004 (0.8x) | none | 87%; FD 10.1 | 10/10 classes |
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
The GAN's 10/10 classes drawn means its one-call samples fall in every class (it is
unconditional; 87% of them confidently in one). Full run: about 31 min on the 2-core CPU shared
with other jobs (ar_digits' 3,000 steps take 15 of them, gan_digits' 20,000 steps about 4.5; the
GAN row was added later and measured by this procedure, the other rows reused); the measuring
alone, with every run reused, about 8 min. The smoke table (`:smoke`, every run a few steps old)
shows the columns, not the families' quality.
"""

from jaxdl.config import load_config, parse_arg
from jaxdl.course import generative_table
from jaxdl.course.generative_configs import toy2d_config
from jaxdl.schema import default_section


def get_config(arg=None):
  smoke = parse_arg(arg, smoke=False).smoke
  # The table's own run is its moons flow (fm_toy2d's config), the teacher of the few-step rows.
  c = toy2d_config("flow_matching", "generative_table", "smoke" if smoke else None)
  c.description = "The generative-model table: calls, time, bits/dim, quality, failure per family"
  c.table = default_section(generative_table.TableSettings)
  if c.smoke:  # one timed call: a smoke run's times are checked to exist, not compared
    c.table.update(dict(num=64, toy_num=300, rounds=2, ll_num=16, ll_steps=8, timed_calls=1))
  return c


def hooks(config):
  """No hooks of its own: `jaxdl train` calls this before training, so a bad `table` key or
  value is refused then, not after the moons flow has trained."""
  generative_table.parse_table(config)
  return []


def after_training(config, workdir, summary=None):
  """`jaxdl train` calls it once trained: the other rows' configs (`row_specs`), loaded here,
  and the table built from them."""
  configs = {key: load_config(spec, overrides)[0]
             for key, (spec, overrides) in generative_table.row_specs(config).items()}
  return generative_table.build_table(config, workdir, summary, configs=configs)
