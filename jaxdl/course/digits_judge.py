"""The judge of generated digits: a digits_cnn run trained beside the generative run, and the
post-training checks of the digits experiments that use it.

The judge is the digits_cnn config (`jaxdl.course.supervised_configs.digits_cnn`, its smoke
size when `config.smoke`; the experiment builds on it) trained into <workdir>/classifier; a
finished run there is reused as is (the engine resumes at its last step, so nothing is trained
again), and a judge copied in from another workdir is reused too.

- `class_check`: fm_ / ddpm_digits_cfg's hook: samples the final checkpoint per class with the
  run's guidance and reports the fraction the judge (or an RBF SVM, `gen.classifier='svm'`)
  labels as the conditioning class (`jaxdl.generative.evaluation`).
- `one_call_check`: vae_ / gan_digits' hook: `gen.eval_num` one-call samples, the fraction the
  judge labels with confidence >= `CONFIDENCE` and the class histogram (`judge_samples`); the
  smoke config skips training the judge.

Shapes: N samples, K classes.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from jaxdl.generative.settings import parse_gen

CONFIDENCE = 0.9


def train_judge(workdir, smoke: bool = False, judge: str = "digits_cnn") -> pathlib.Path:
  """Trains the judge, the digits_cnn config (`jaxdl.course.supervised_configs.digits_cnn`, its
  smoke size when `smoke`), into <workdir>/classifier and returns that directory; a finished run
  there is reused. `judge` is the config's `gen.classifier`: 'digits_cnn' is the one judge."""
  from jaxdl.course.supervised_configs import digits_cnn
  from jaxdl.schema import ConfigError
  from jaxdl.train import run
  if judge != "digits_cnn":
    raise ConfigError(f"gen.classifier: expected 'digits_cnn' (or 'svm' where the check allows "
                      f"it), got {judge!r}")
  directory = pathlib.Path(workdir) / "classifier"
  config = digits_cnn(smoke)
  config.train.plot = False
  run(config, directory, progress=False)
  return directory


def judge_outputs(workdir, smoke: bool = False):
  """f(pixels16_Nx64) -> (probs_NxK, features_NxH) of the judge trained by `train_judge`, for
  `jaxdl.generative.evaluation.digits_quality`."""
  from jaxdl.generative import evaluation
  return evaluation.classifier_outputs(train_judge(workdir, smoke))


def judge_samples(x_Nx8x8x1, classifier_dir, scale: str = "symmetric") -> dict:
  """The classification run in `classifier_dir` on samples in the data's `scale` ([-1, 1] when
  'symmetric', else [0, 1]): the fraction whose top class has probability >= CONFIDENCE, and
  how many samples each class gets."""
  import jax
  from jaxdl.train import load_run
  config, model, variables, _ = load_run(classifier_dir)
  x = np.asarray(x_Nx8x8x1)
  x = (np.clip(x, -1, 1) + 1) / 2 if scale == "symmetric" else np.clip(x, 0, 1)  # to 'unit'
  shape = tuple(config.model.get("image_shape") or (8, 8, 1))
  probs_NxK = np.asarray(jax.nn.softmax(model.apply(variables, x.reshape((-1,) + shape),
                                                    train=False)))
  return {"confident_fraction": float(np.mean(probs_NxK.max(1) >= CONFIDENCE)),
          "class_counts": np.bincount(probs_NxK.argmax(1), minlength=10).tolist()}


def class_check(config, workdir, summary=None) -> dict:
  """Samples the final checkpoint of a class-conditional digits run and measures it
  (generative_eval.json, digits_grid.png). `gen.classifier` names the judge: 'svm' lets the
  evaluation fit an RBF SVM (seconds); 'digits_cnn' is that config trained into
  <workdir>/classifier first (`train_judge`)."""
  from jaxdl.generative import evaluation
  judge = parse_gen(config).classifier
  classifier = train_judge(workdir, config.smoke, judge) if judge != "svm" else None
  return evaluation.after_training(config, workdir, summary, classifier=classifier)


def one_call_check(config, workdir, summary=None) -> dict:
  """Samples the final checkpoint of a 'vae' or 'gan' digits run (one network call per sample,
  key 0) and judges it unless `config.smoke` (`judge_samples`: always a digits_cnn run, whose
  probabilities give the confidence); the VAE's evaluation from `summary` is kept beside it.
  Writes generative_eval.json; returns {'generative': ...}."""
  import jax
  from jaxdl.generative import gan, vae
  from jaxdl.train import load_run
  families = {"vae": vae, "gan": gan}
  family = families.get(config.task)
  if family is None:
    raise ValueError(f"task: {config.task!r} has no one-call check; expected 'vae' or 'gan'")
  _, model, variables, step = load_run(workdir)
  sample = family.make_run_sampler(config, model)
  x = sample(variables, jax.random.PRNGKey(0), config.gen.eval_num)
  out = {"step": int(step)}
  if family is vae:
    out["eval"] = dict((summary or {}).get("eval", {}))
  if not config.smoke:
    out.update(judge_samples(x, train_judge(workdir), config.data.scale))
  pathlib.Path(workdir, "generative_eval.json").write_text(json.dumps(out, indent=2))
  return {"generative": out}
