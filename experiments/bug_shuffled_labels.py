"""Planted bug: labels shuffled against their inputs (digits 64-64 MLP) -- the doctor must name it.

Run:
  jaxdl doctor bug_shuffled_labels          # exit 1: learnable FAILs
  jaxdl train bug_shuffled_labels           # the loss stays near ln 10, accuracy near 0.1

Setup: the digits MLP of `jaxdl.course.planted` trained with task 'planted_shuffled_labels',
which rolls each batch's labels by one row, so every input carries another example's label.

Expected diagnosis: first loss fine (about ln 10) and one batch can still be memorized, but the
held-out loss stays at ln 10 = 2.30 after 100 steps: learnable FAIL, likely cause
`labels_misaligned` (symptom: loss flat from the start).
"""

import jaxdl.course.planted as planted  # registers the planted-bug model and task
from jaxdl.config import parse_arg


def get_config(arg=None):
  return planted.digits_experiment(
      "bug_shuffled_labels", "Planted bug: digits labels shuffled against inputs (held-out loss "
      "stays at ln 10)", task="planted_shuffled_labels", smoke=parse_arg(arg, smoke=False).smoke)
