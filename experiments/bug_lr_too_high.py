"""Planted bug: learning rate far too high (SGD, lr 1000, digits MLP) -- the loss turns NaN.

Run:
  jaxdl doctor bug_lr_too_high              # exit 1: first_steps FAILs
  jaxdl train bug_lr_too_high               # exit 1: loss became non-finite

Setup: the healthy digits MLP of `jaxdl.course.planted` with plain SGD at lr 1000 and no
clipping.

Expected diagnosis: first loss fine; within the first 20 steps the loss explodes (2.3 -> 4e6 ->
3e19) and turns NaN at step 3: first_steps FAIL, likely cause `lr_too_high` (symptom: loss
becomes NaN or Inf).
"""

import jaxdl.course.planted as planted  # registers the planted-bug model and task
from jaxdl.config import parse_arg


def get_config(arg=None):
  c = planted.digits_experiment(
      "bug_lr_too_high", "Planted bug: SGD at lr 1000 on digits (loss NaN within 20 steps)",
      smoke=parse_arg(arg, smoke=False).smoke)
  c.optim.update(name="sgd", lr=1000.0, clip_norm=None)
  return c
