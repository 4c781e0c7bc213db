"""Pre-LN vs post-LN: the experiment's variants differ only in the layout and the warmup. (The
gradient norms at initialization are the `prepost_ln_grads` claim, which test_reproduce runs.)"""

from jaxdl.config import load_config


def test_variants_differ_only_in_layout_and_warmup():
  config, module = load_config("prepost_ln:smoke")
  cfgs = {(ln, w): module.variant_config(config, ln, w) for ln in ("pre", "post")
          for w in (0.0, 0.1)}
  assert {c.model.ln for c in cfgs.values()} == {"pre", "post"}
  assert cfgs["post", 0.0].model.to_dict() == {**cfgs["pre", 0.0].model.to_dict(), "ln": "post"}
  assert cfgs["pre", 0.1].optim.lr == cfgs["pre", 0.0].optim.lr == 5e-3  # the same peak lr
  assert "warmup_frac" not in cfgs["pre", 0.0]
