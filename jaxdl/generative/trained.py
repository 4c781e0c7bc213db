"""What a trained generative run gives: its samples and its likelihood on held-out data.

`sample_run` draws samples from a run's latest checkpoint (`jaxdl sample`) through
`jaxdl.generative.tasks.make_run_sampler(config, model, ...)`, i.e. `samplers.make_sampler` with
the run's path, prediction and classes, or one network call for a VAE or GAN; `save_samples`
writes them as a PNG (an image grid, or a scatter plot for 2-D data) or .npy.

`run_likelihood` is `jaxdl likelihood`: the mean log p(x) of the first examples of the run's
evaluation split, exact through the probability-flow ODE for a flow or diffusion run
(`likelihood.run_log_likelihood`), the ELBO (a lower bound) for a VAE (`vae.run_elbo`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxdl import data as jdata
from jaxdl.data import parse_data
from jaxdl.generative import gan, likelihood, tasks, vae
from jaxdl.generative.settings import parse_gen
from jaxdl.train import load_run
from jaxdl.train.tasks import kind_of

EXACT_MAX_DIMS = 16  # divergence 'auto': the exact trace costs D JVPs per evaluation


def sample_run(workdir, *, sampler=None, steps=None, guidance=None, eta=None, cls=None, num=64,
               seed=0, ema=True):
  """Returns (config, samples as a numpy array (num, *sample_shape)) for a trained run, from its
  parameter average when it kept one and `ema`, else from its last parameters."""
  config, model, variables, _ = load_run(workdir, ema=ema)
  if kind_of(config.task).one_call:
    return config, _sample_one_call(config, model, variables, num, seed, sampler=sampler,
                                    steps=steps, guidance=guidance, eta=eta, cls=cls)
  if cls is not None and not config.gen.num_classes:
    raise ValueError(f"--class {cls}: the run in {workdir} is unconditional (gen.num_classes = 0)")
  if guidance is not None and cls is None:
    raise ValueError("--guidance needs --class: the class to guide towards")
  sample = tasks.make_run_sampler(config, model, sampler=sampler, steps=steps, eta=eta,
                                  guidance=guidance if guidance is not None else (
                                      config.gen.guidance if cls is not None else None))
  return config, np.asarray(sample(variables, jax.random.PRNGKey(seed), num, y=cls))


def _sample_one_call(config, model, variables, num, seed, **options):
  """A VAE or GAN sample is one network call from z ~ N(0, I) (the decoder's mean, the
  generator's output): the options of a sampler loop (and a class, for these unconditional
  models) are refused, naming the first one given."""
  given = [name for name, value in options.items() if value is not None]
  if given:
    flag = {"cls": "class"}.get(given[0], given[0])
    raise ValueError(f"--{flag}: a {config.task!r} run samples with one network call and takes "
                     f"no --{flag} (options of flow_matching / ddpm runs)")
  family = {"vae": vae, "gan": gan}[config.task]
  sample = family.make_run_sampler(config, model)
  return np.asarray(sample(variables, jax.random.PRNGKey(seed), num))


def save_samples(config, x, out: str) -> None:
  """Writes samples `x` of the run `config` to `out`: the raw array for a .npy name, else a PNG
  (a scatter plot of 2-D points, or a grid of the images)."""
  if out.endswith(".npy"):
    np.save(out, x)
    return
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  if x.ndim == 2 and x.shape[1] == 2:
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.scatter(x[:, 0], x[:, 1], s=2, alpha=0.6)
    ax.set_aspect("equal")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return
  img = x.reshape((len(x),) + tuple(config.gen.sample_shape))[..., 0]
  if getattr(parse_data(config.data), "scale", None) == "symmetric":  # digits in [-1, 1]
    img = (img + 1) / 2
  n, (h, w) = len(img), img.shape[1:]
  cols = int(math.ceil(math.sqrt(n)))
  rows = int(math.ceil(n / cols))
  canvas = np.ones((rows * (h + 1) + 1, cols * (w + 1) + 1))
  for i in range(n):
    r, c = divmod(i, cols)
    canvas[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = img[i]
  plt.imsave(out, np.clip(canvas, 0, 1), cmap="gray_r", vmin=0, vmax=1)


def eval_examples(config, num: int) -> dict:
  """The first `num` examples of the run's evaluation split ('x', and 'y' where it has labels);
  fewer when the split is smaller."""
  parts, have = [], 0
  for batch in jdata.make_dataset(config).eval_batches(batch_size=min(num, 512)):
    keep = np.asarray(batch["mask"]) > 0  # the last batch is padded to the batch size
    parts.append({k: np.asarray(v)[keep] for k, v in batch.items() if k in ("x", "y")})
    have += int(keep.sum())
    if have >= num:
      break
  if not have:
    raise ValueError(f"data: the run's evaluation split ({config.data.name}) is empty")
  return {k: np.concatenate([p[k] for p in parts])[:num] for k in parts[0]}


def run_likelihood(workdir, *, num: int = 256, steps: int | None = None,
                   divergence: str | None = None, probes: int | None = None, seed: int = 0,
                   ema: bool = True, batch_size: int = 256) -> dict:
  """What `jaxdl likelihood` prints, as a dict. The examples are solved `batch_size` at a time
  (one compiled solve; the result does not depend on the batch size)."""
  config, model, variables, step = load_run(workdir, ema=ema)
  examples = eval_examples(config, num)
  x = examples["x"]
  dims = math.prod(x.shape[1:])
  head = {"workdir": str(workdir), "step": int(step), "task": config.task, "num": len(x),
          "dims": dims}
  if kind_of(config.task).likelihood == "elbo":
    bound = vae.run_elbo(model, variables, x, batch_size=batch_size)
    return {**head, "kind": "bound (-ELBO, one z per example)", "nats": bound["elbo"],
            "bits_per_dim": bound["bpd"]}
  steps, probes = steps or 100, probes or 1
  if divergence in (None, "auto"):
    divergence = "exact" if dims <= EXACT_MAX_DIMS else "hutchinson"
  y = examples.get("y") if parse_gen(config).num_classes else None
  out = likelihood.run_log_likelihood(config, model, variables, x, steps=steps,
                                      divergence=divergence, probes=probes,
                                      rng=jax.random.PRNGKey(seed), y=y, batch_size=batch_size)
  return {**head, "kind": "exact (probability-flow ODE)", "conditional": y is not None,
          "nats": float(np.mean(np.asarray(out["logp"]))),
          "bits_per_dim": float(np.mean(np.asarray(out["bpd"]))), "steps": steps,
          "divergence": divergence, "probes": probes if divergence == "hutchinson" else None}
