"""Pre-LN vs post-LN at initialization: the `prepost_ln_grads` claim holds and measures the
numbers experiments/prepost_ln.py documents."""

import numpy as np

from jaxdl.course.claims import prepost_ln_grads
from jaxdl.config import load_config


def test_post_ln_gradients_are_larger_near_the_output():
  ratio_row, pre_row = prepost_ln_grads()
  assert ratio_row.ok and pre_row.ok
  # The experiment's docstring: pre-LN 0.208 0.124 0.104 0.082 0.074 0.065 per block and
  # post/pre from 0.863 at block 2 to 1.508 at block 6 (seed 0, fp32 on CPU; 1% tolerance).
  np.testing.assert_allclose(pre_row.measured, [0.208, 0.124, 0.104, 0.082, 0.074, 0.065],
                             rtol=0.01)
  np.testing.assert_allclose([ratio_row.measured[0], ratio_row.measured[-1]], [0.863, 1.508],
                             rtol=0.01)


def test_variants_differ_only_in_layout_and_warmup():
  config, module = load_config("prepost_ln:smoke")
  cfgs = {(ln, w): module.variant_config(config, ln, w) for ln in ("pre", "post")
          for w in (0.0, 0.1)}
  assert {c.model.ln for c in cfgs.values()} == {"pre", "post"}
  assert cfgs["post", 0.0].model.to_dict() == {**cfgs["pre", 0.0].model.to_dict(), "ln": "post"}
  assert cfgs["pre", 0.1].optim.lr == cfgs["pre", 0.0].optim.lr == 5e-3  # the same peak lr
  assert "warmup_frac" not in cfgs["pre", 0.0]
