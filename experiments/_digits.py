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
