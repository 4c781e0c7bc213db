"""Shared setup of the digits experiments (not an experiment itself): the classification config,
and the class check of the class-conditional generative experiments (fm_/ddpm_digits_cfg), whose
judge, a digits_cnn run, is trained here rather than inside the library."""

import pathlib

from jaxdl.config import base_config, parse_arg
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def digits_config(name: str, description: str, model: dict, steps: int, arg=None):
  """Digits scaled to [0, 1], the fixed 1437 / 360 split, batch 128, AdamW 2e-3 (decay 1e-4 on
  kernels) with 5% warmup and cosine; eval and checkpoints every 500 steps, best by accuracy."""
  c = base_config()
  c.name = name
  c.description = description
  c.task = "classification"
  c.data = default_data_config("digits")
  c.data.batch_size = 128
  c.model = model
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 2e-3
  c.optim.weight_decay = 1e-4
  c.optim.schedule.name = "warmup_cosine"
  c.train.steps = steps
  c.train.eval_every = 500
  c.train.log_every = 20
  c.train.ckpt_every = 500
  c.train.best_metric = "eval/accuracy"
  c.train.best_mode = "max"
  if parse_arg(arg, smoke=False).smoke:
    c.train.steps = 20
    c.train.eval_every = 10
    c.train.ckpt_every = 10
  return c


def train_classifier(workdir, experiment: str = "digits_cnn") -> pathlib.Path:
  """Trains `experiment` into <workdir>/classifier and returns that directory. A finished run
  there is reused as is (the engine resumes at its last step, so nothing is trained again)."""
  from jaxdl.config import load_config
  from jaxdl.train import run
  directory = pathlib.Path(workdir) / "classifier"
  config, _ = load_config(experiment, ["train.plot=False"])
  run(config, directory, progress=False)
  return directory


def generative_after_training(config, workdir, summary):
  """The digits generative experiments' hook: samples the final checkpoint and measures it
  (generative_eval.json, digits_grid.png). `gen.classifier` names the judge of the class check:
  'digits_cnn' trains that experiment into <workdir>/classifier first; 'svm' lets the evaluation
  fit an RBF SVM (seconds)."""
  from jaxdl.generative import evaluation
  judge = config.gen.get("classifier", "svm")
  if judge not in ("digits_cnn", "svm"):
    raise ValueError(f"gen.classifier: {judge!r}; expected 'digits_cnn' or 'svm'")
  classifier = train_classifier(workdir, judge) if judge != "svm" else None
  return evaluation.after_training(config, workdir, summary, classifier=classifier)


def few_step_teacher(config, workdir):
  """(model, teacher variables, judge) of the few-step digits experiments (reflow_digits,
  distill_digits): the class-conditional flow model of `config` trained into <workdir>/teacher
  and a digits_cnn run into <workdir>/classifier (both reused when present), the judge being its
  `evaluation.classifier_outputs`.

  The teacher's config is `config` without its few-step section, named fm_digits_cfg: with the
  same overrides the two experiments' teachers are the same run (a finished fm_digits_cfg run,
  copied to <workdir>/teacher, is reused as is).
  """
  from jaxdl.config import load_config
  from jaxdl.generative import evaluation
  from jaxdl.train import load_run
  from jaxdl.train import run
  smoke = config.train.steps < 1000
  teacher = config.copy_and_resolve_references()
  with teacher.unlocked():
    for section in ("reflow", "distill"):
      if section in teacher:
        del teacher[section]
  reference = load_config("fm_digits_cfg:smoke" if smoke else "fm_digits_cfg")[0]
  teacher.name, teacher.description = reference.name, reference.description
  teacher_dir = pathlib.Path(workdir) / "teacher"
  run(teacher, teacher_dir, progress=False)
  _, model, variables, _ = load_run(teacher_dir, teacher)
  judge = evaluation.classifier_outputs(
      train_classifier(workdir, "digits_cnn:smoke" if smoke else "digits_cnn"))
  return model, variables, judge


def unguided(config):
  """`config` for a student that learned the guided teacher: sampled with no guidance (one
  network call per step, where the guided teacher makes two)."""
  config = config.copy_and_resolve_references()
  config.gen.guidance = None
  return config


def euler_quality(config, model, variables, judge, steps: int, per_class: int = 50):
  """(quality, pixels16_Nx64) of Euler at `steps` with the config's guidance, `per_class` samples
  of each class (key 0): `evaluation.digits_quality` (confident and of the class, Frechet
  distance of the judge's features to real digits and its floor)."""
  import jax
  import numpy as np
  from jaxdl.generative import evaluation, tasks
  sample = tasks.make_run_sampler(config, model, sampler="euler", steps=steps)
  y_N = np.repeat(np.arange(config.gen.num_classes), per_class)
  pix_Nx64 = evaluation._to_pixels16(sample(variables, jax.random.PRNGKey(0), len(y_N), y=y_N),  # noqa: SLF001
                                     config.data.scale)
  return evaluation.digits_quality(judge, pix_Nx64, y_N), pix_Nx64
