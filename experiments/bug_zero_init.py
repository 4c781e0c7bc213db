"""Planted bug: all-zero init (digits 64-64 MLP) -- every unit of a layer stays identical.

Run:
  jaxdl doctor bug_zero_init                # exit 1: symmetry and overfit FAIL
  jaxdl train bug_zero_init                 # the loss stays at ln 10

Setup: the digits MLP of `jaxdl.course.planted` with every kernel (and bias) initialized to 0
(model.zero_init = True).

Expected diagnosis: the first loss is exactly ln 10 (all logits 0), so that check passes; every
hidden output is 0 and only the head bias gets a gradient; the units of dense_0, dense_1 and
head are identical at init and still after 20 steps: symmetry FAIL with cause
`symmetric_init`; overfit FAIL (2.30 -> 2.1, never near 0).
"""

import jaxdl.course.planted as planted  # registers the planted-bug model and task
from jaxdl.config import parse_arg


def get_config(arg=None):
  return planted.digits_experiment(
      "bug_zero_init", "Planted bug: all-zero init on digits (units identical, loss stuck at "
      "ln 10)", smoke=parse_arg(arg, smoke=False).smoke, zero_init=True)
