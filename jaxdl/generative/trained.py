"""What a trained generative run gives: its samples and its likelihood on held-out data.

`sample_run` draws samples from a run's latest checkpoint (`jaxdl sample`) through
`jaxdl.generative.tasks.make_run_sampler(config, model, ...)`, i.e. `samplers.make_sampler` with
the run's path, prediction and classes (every class, a labelled row each, on a class-conditional
run), or one network call for a VAE or GAN; `save_samples` writes them as a figure (an image
grid, or a scatter plot for 2-D data) or the raw arrays.

`run_likelihood` is `jaxdl likelihood`: the mean log p(x) of the first examples of the run's
evaluation split, exact through the probability-flow ODE for a flow or diffusion run
(`likelihood.run_log_likelihood`), the ELBO (a lower bound) for a VAE (`vae.run_elbo`).
"""

from __future__ import annotations

import json
import math
import os

import jax
import numpy as np

from jaxdl import data as jdata
from jaxdl.data import parse_data
from jaxdl.generative import evaluation, gan, likelihood, samplers, tasks, vae
from jaxdl.generative.settings import parse_gen
from jaxdl.models import build_model
from jaxdl.schema import ConfigError
from jaxdl.train import load_run
from jaxdl.train.tasks import TASKS, kind_of, task_names

EXACT_MAX_DIMS = 16  # divergence 'auto': the exact trace costs D JVPs per evaluation
SAMPLE_SUFFIXES = (".png", ".jpg", ".pdf", ".npy", ".npz")  # what `save_samples` writes
NUM, PER_CLASS = 64, 8  # default samples: in all, or of each class of a class-conditional run


def check_out(out: str) -> None:
  """Refuses an output path `save_samples` cannot write, before any work: a folder, a name
  without a supported suffix, a parent folder that is missing or read-only."""
  if os.path.isdir(out):
    raise ConfigError(f"--out {out}: is a folder; expected a file name ending in "
                      f"{', '.join(SAMPLE_SUFFIXES)}")
  if os.path.splitext(out)[1].lower() not in SAMPLE_SUFFIXES:
    raise ConfigError(f"--out {out}: expected a file name ending in {', '.join(SAMPLE_SUFFIXES)}")
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise ConfigError(f"--out {out}: folder {folder} does not exist")
  if not os.access(folder, os.W_OK):
    raise ConfigError(f"--out {out}: folder {folder} is not writable")


def read_run_config(workdir):
  """The config of the generative run in `workdir` (config.json only), refusing in one line a
  workdir without a run or with a run that has nothing to sample."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise ConfigError(f"{workdir}: no trained run here (no config.json)")
  try:
    with open(path, encoding="utf-8") as f:
      config = ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e})".splitlines()[0]) from None
  task = config.get("task")
  kind = TASKS.get(task)  # an unknown task (another package's, or none) samples nothing either
  if kind is None or not kind.is_generative:
    raise ConfigError(f"{workdir}: a {task!r} run has nothing to sample; `jaxdl sample` needs "
                      f"a {' or '.join(task_names(lambda k: k.is_generative))} run")
  return config


def sample_run(workdir, *, sampler=None, steps=None, guidance=None, eta=None, cls=None, num=None,
               seed=0, ema=True):
  """(config, samples (num, *sample_shape) as numpy, their classes (num,) or None, a one-line
  title saying what drew them) of the trained run in `workdir`, from its parameter average when
  it kept one and `ema`.

  A class-conditional run without `cls` samples every class, `num` (default PER_CLASS) of each,
  class by class; with `cls`, `num` (default NUM) of that class; an unconditional run `num`.
  Guidance is the run's (`gen.guidance`) unless given. Every option is checked, in one line
  naming its flag, and the sampler built (nothing compiled) before the checkpoint is read.
  """
  if num is not None and num < 1:
    raise ConfigError(f"--num: must be >= 1, got {num}")
  config = read_run_config(workdir)
  options = dict(sampler=sampler, steps=steps, guidance=guidance, eta=eta)
  model = build_model(config.model)
  if kind_of(config.task).one_call:
    sample = _one_call_sampler(config, model, cls=cls, **options)
    y, how = None, "one network call"
  else:
    sample, y = _path_sampler(config, model, cls, num, **options)
    s = sample.settings
    how = (f"{s.sampler}, {s.steps} steps ({sample.calls} network calls)"
           + ("" if s.guidance is None else f", guidance w = {s.guidance:g}"))
  _, _, variables, step = load_run(workdir, config, ema=ema)
  n = len(y) if y is not None else (num or NUM)
  x = sample(variables, jax.random.PRNGKey(seed), n, **({} if y is None else {"y": y}))
  title = f"{config.get('name') or workdir} at step {int(step)}: {how}"
  return config, np.asarray(x), y, title


def _path_sampler(config, model, cls, num, **options):
  """(sample fn, labels or None) of a flow / diffusion run (`sample_run`)."""
  given = {k: v for k, v in options.items() if v is not None}
  try:  # the flags alone first, so that a bad one is named as the flag
    samplers.SamplerSettings.of(**given)
  except ConfigError as e:
    raise ConfigError(f"--{e}") from None
  k = parse_gen(config).num_classes
  if not k and (cls is not None or options["guidance"] is not None):
    flag = "--class" if cls is not None else "--guidance"
    raise ConfigError(f"{flag}: the run is unconditional (gen.num_classes = 0)")
  if cls is not None and not 0 <= cls < k:
    raise ConfigError(f"--class: must be in 0..{k - 1} (the run's classes), got {cls}")
  sample = tasks.make_run_sampler(config, model, **options)
  if not k:
    return sample, None
  if cls is not None:
    return sample, np.full(num or NUM, cls, np.int32)
  return sample, np.repeat(np.arange(k, dtype=np.int32), num or PER_CLASS)


def _one_call_sampler(config, model, **options):
  """A VAE or GAN sample is one network call from z ~ N(0, I) (the decoder's mean, the
  generator's output): the options of a sampler loop (and a class, for these unconditional
  models) are refused, naming the first one given."""
  given = [name for name, value in options.items() if value is not None]
  if given:
    flag = {"cls": "class"}.get(given[0], given[0])
    raise ConfigError(f"--{flag}: a {config.task!r} run samples with one network call and takes "
                      f"no --{flag} (options of flow_matching / ddpm / edm runs)")
  family = {"vae": vae, "gan": gan}[config.task]
  return family.make_run_sampler(config, model)


def save_samples(config, x, out: str, y=None, title: str | None = None) -> None:
  """Writes samples `x` (classes `y` or None) of the run `config` to `out` by its suffix
  (`SAMPLE_SUFFIXES`): .npy the raw array, .npz x and y, else a figure: a scatter plot of 2-D
  points (coloured by class), or a grid of the images, one labelled row per class when `y` holds
  every class in turn (`evaluation.image_grid`). Written beside `out` under a temporary name and
  renamed, so `out` is whole or absent."""
  suffix = os.path.splitext(out)[1].lower()
  tmp = os.path.join(os.path.dirname(os.path.abspath(out)),
                     f".{os.path.basename(out)}.{os.getpid()}.tmp{suffix}")
  try:
    _write_samples(config, x, tmp, suffix, y, title)
    os.replace(tmp, out)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _write_samples(config, x, path, suffix, y, title):
  if suffix == ".npy":
    np.save(path, x)
    return
  if suffix == ".npz":
    np.savez(path, x=x, **({} if y is None else {"y": y}))
    return
  if x.ndim == 2 and x.shape[1] == 2:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.scatter(x[:, 0], x[:, 1], s=2, alpha=0.6,
               **({} if y is None else {"c": y, "cmap": "tab10"}))
    ax.set_aspect("equal")
    if title:
      ax.set_title(title, fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return
  img = x.reshape((len(x),) + tuple(config.gen.sample_shape))
  if getattr(parse_data(config.data), "scale", None) == "symmetric":  # digits in [-1, 1]
    img = (img + 1) / 2
  if y is not None and len(np.unique(y)) > 1:  # every class in turn: one row each
    classes = np.unique(y)
    evaluation.image_grid(img.reshape((len(classes), -1) + img.shape[1:]), path,
                          row_labels=classes, title=title)
    return
  cols = int(math.ceil(math.sqrt(len(img))))
  rows = int(math.ceil(len(img) / cols))
  pad = np.zeros((rows * cols - len(img),) + img.shape[1:], img.dtype)
  evaluation.image_grid(np.concatenate([img, pad]).reshape((rows, cols) + img.shape[1:]), path,
                        title=title)


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
