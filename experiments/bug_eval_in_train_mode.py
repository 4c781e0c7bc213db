"""Planted bug: evaluation run in training mode (BatchNorm on batch statistics at eval, digits).

Run:
  jaxdl doctor bug_eval_in_train_mode       # exit 1: eval_mode FAILs
  jaxdl train bug_eval_in_train_mode        # train accuracy high, eval accuracy much lower
  jaxdl doctor bug_eval_in_train_mode --history   # then: "good in training, bad in evaluation"

Setup: the digits MLP of `jaxdl.course.planted` with BatchNorm after each hidden layer whose
eval path still normalizes with the statistics of the batch (model.eval_batch_stats = True),
evaluated in batches of 2 (data.eval_batch_size = 2) as a small serving batch would be.

Expected diagnosis: eval_mode FAIL: the eval-mode outputs of the same 8 examples computed in a
batch of 8 and a batch of 16 differ (by about 2 in logit units, tolerance about 1e-3), cause
`eval_mode_forgotten`. After the 300 training steps the metrics history shows eval accuracy far
below train accuracy from the first eval on (about 0.54 vs 0.97 at step 300; eval loss 1.38 vs
train 0.13): `--history` reports "good in training, bad in evaluation".
"""

import jaxdl.course.planted as planted  # registers the planted-bug model and task
from jaxdl.config import parse_arg


def get_config(arg=None):
  c = planted.digits_experiment(
      "bug_eval_in_train_mode", "Planted bug: BatchNorm uses batch statistics in eval (digits, "
      "eval batches of 2)", smoke=parse_arg(arg, smoke=False).smoke, norm="batch",
      eval_batch_stats=True)
  c.data.eval_batch_size = 2
  return c
