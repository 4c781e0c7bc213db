"""The autoregressive digits model measured: exact bits per dimension and judged samples
(ar_digits' post-training procedure, and the AR row of the generative table).

A GPT trained on `jaxdl.data.digit_tokens` ([16 + c, q_0, ..., q_63], 16 pixel levels) models
p(q | c) = prod_i p(q_i | q_<i, c) exactly:
- `bits_per_dim`: the mean -log2 p(q_i | q_<i, c) over the pixels of given sequences (a uniform
  model scores 4);
- `digit_sampler`: class-conditional samples through the KV-cache decoder (`models.decoding`:
  one prompt pass, then 64 cached steps), temperature 1;
- `evaluate_ar_digits(config, workdir)`: both on the run in `workdir`, its `gen.per_class`
  samples per class judged by a digits_cnn run (`jaxdl.course.digits_judge`, into
  <workdir>/classifier); writes ar_digits.json and digits_grid.png.

Shapes: N sequences, P = 64 pixels, V = 26 tokens.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from jaxdl.data.digit_tokens import CLASSES, LEVELS, PIXELS, dequantize, split_sequences


def bits_per_dim(model, params, x_NxP, y_NxP) -> float:
  """Exact mean -log2 p(q_i | q_<i, c) over the pixels (the logits of the class and pixel
  tokens are restricted to the 16 pixel levels: a class token is never a valid pixel)."""
  import jax
  logits = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))(params, x_NxP)
  logp = jax.nn.log_softmax(logits[..., :LEVELS], -1)
  nll = -np.take_along_axis(np.asarray(logp), y_NxP[..., None], -1)
  return float(nll.mean() / math.log(2))


def digit_sampler(model):
  """f(params, labels_N, seed=0) -> token grids (N, P) through the KV-cache decoder (the class
  token as prompt, 64 new tokens; class-token draws, impossible after training, clipped to 15),
  compiled once per model."""
  import jax
  from jaxdl.models import decoding
  sample = decoding.make_generator(model, PIXELS)

  def f(params, labels_N, seed: int = 0):
    prompt = (LEVELS + np.asarray(labels_N, np.int32))[:, None]
    return np.minimum(np.asarray(sample(params, prompt, jax.random.PRNGKey(seed))[:, 1:]),
                      LEVELS - 1)

  return f


def evaluate_ar_digits(config, workdir, summary=None) -> dict:
  """Bits/dim of the test and training splits and the judged samples of the run in `workdir`;
  returns {'ar_digits': ...}."""
  from jaxdl.course import digits_judge
  from jaxdl.generative import evaluation
  from jaxdl.train import load_run
  del summary
  workdir = pathlib.Path(workdir)
  _, model, variables, step = load_run(workdir, config)
  params = variables["params"]
  train_xy, test_xy = split_sequences()
  out = {"step": int(step), "bits_per_dim": {"test": bits_per_dim(model, params, *test_xy),
                                             "train": bits_per_dim(model, params, *train_xy)}}
  labels = np.repeat(np.arange(CLASSES), config.gen.per_class)
  pix_Nx64 = dequantize(digit_sampler(model)(params, labels, config.seed))
  judge = evaluation.classifier_outputs(
      digits_judge.train_judge(workdir, config.smoke, config.gen.classifier))
  out["samples"] = evaluation.digits_quality(judge, pix_Nx64, labels,
                                             threshold=config.gen.threshold)
  evaluation.digit_grid(pix_Nx64.reshape(CLASSES, -1, 8, 8)[:, :10], workdir / "digits_grid.png")
  (workdir / "ar_digits.json").write_text(json.dumps(out, indent=2))
  return {"ar_digits": out}
