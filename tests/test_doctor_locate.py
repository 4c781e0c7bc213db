"""NaN/Inf locator: a planted module turns one example's activations into +Inf at a known step.

The planted digits MLP (`jaxdl.course.planted`, inf_layer=1) routes dense_1's output through a
module named 'planted_inf' that sets the marked example's row to +Inf. The marked example sits at
row 0 of the batch at data position K, so the run stops with NonFiniteLossError at step K + 1; the
locator, replaying from the last checkpoint (step 10), must name 'planted_inf', that step, batch
position K and row 0.
"""

import pytest

from jaxdl import train
from jaxdl.course import planted
from jaxdl.doctor import locate_nonfinite

K = 12


def _config(inf_layer: int = 1):
  c = planted.digits_experiment("locate_test", "locator", steps=20)
  c.train.eval_every = 0
  c.train.log_every = 1
  c.train.ckpt_every = 5
  c.train.async_checkpoint = False
  c.train.plot = False
  c.model.poison_row = planted.poison_row_at_step(c, K)
  c.model.inf_layer = inf_layer
  return c


def test_locator_names_the_planted_module_step_and_row(tmp_path):
  config = _config()
  with pytest.raises(train.NonFiniteLossError) as err:
    train.run(config, tmp_path, progress=False)
  assert err.value.step == K + 1
  finding = locate_nonfinite(config, tmp_path, err.value.step)
  assert finding.reproduced and finding.where == "forward"
  assert finding.module == "planted_inf"
  assert finding.previous_module == "dense_1"    # its input was still finite
  assert (finding.step, finding.batch_index, finding.epoch) == (K + 1, K, 0)
  assert finding.restored_from == 10             # newest checkpoint before the failing step
  assert finding.rows == [0] and finding.batch_size == 32
  assert "planted_inf" in finding.text() and f"step {K + 1}" in finding.text()


def test_locator_rejects_a_bad_step(tmp_path):
  with pytest.raises(ValueError, match="step: must be >= 1"):
    locate_nonfinite(_config(), tmp_path, 0)
