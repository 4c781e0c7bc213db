"""Planted bug: the last layer's init scaled x100 (digits 64-64 MLP) -- the doctor must name it.

Run:
  jaxdl doctor bug_last_layer_x100          # exit 1: first_loss FAILs
  jaxdl train bug_last_layer_x100           # trains, but starts from a loss of about 50

Setup: `jaxdl.course.planted` MLP 64 -> 64 -> 10 on 8x8 digits, batch 32, Adam 1e-3, with the
head kernel multiplied by 100 at init (model.head_scale = 100).

Expected diagnosis: first_loss FAIL, first loss about 55 vs ln 10 = 2.30 with logit std about 27;
likely cause `last_layer_too_large` (symptom: first loss far from ln K).
"""

import jaxdl.course.planted as planted  # registers the planted-bug model and task
from jaxdl.config import parse_arg


def get_config(arg=None):
  return planted.digits_experiment(
      "bug_last_layer_x100", "Planted bug: last layer init x100 on digits (first loss ~55 vs "
      "ln 10)", smoke=parse_arg(arg, smoke=False).smoke, head_scale=100.0)
