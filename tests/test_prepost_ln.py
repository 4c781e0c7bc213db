"""Pre-LN vs post-LN: the study's variants are tested in test_studies
(`test_layernorm_variants_differ_only_in_layout_and_warmup`); the gradient norms at
initialization are the `prepost_ln_grads` claim, which test_reproduce runs."""

from jaxdl.config import load_config


def test_the_experiment_trains_pre_ln_without_warmup_and_hands_the_rest_to_the_study():
  config, module = load_config("prepost_ln:smoke")
  assert (config.model.ln, config.optim.schedule.warmup_frac, config.warmup_frac) == ("pre", 0.0,
                                                                                       0.1)
  assert not hasattr(module, "run") and hasattr(module, "after_training")
