"""The generative training tasks 'flow_matching', 'ddpm' and 'edm', and their run's sampler.

Both read `config.gen` (`jaxdl.generative.settings.PathSettings`):
  path:       'flow' for flow_matching; 'ddpm' uses schedule ('linear' | 'cosine') and T; 'edm'
              sigma_data, sigma_min, sigma_max, p_mean, p_std (`EDMSettings`, `paths.EDMPath`)
  prediction: the network output and regression target ('velocity' for the flow; 'eps', 'x0' or
              'v' for DDPM; 'edm', Karras's F, for EDM), see `jaxdl.generative.losses`
  num_classes, p_uncond: class conditioning; each label becomes the null class K = num_classes
              with probability p_uncond in training (classifier-free guidance)
  sampler, steps, eta, guidance, ...: the default sampler of `make_run_sampler` (and `jaxdl
              sample`), `samplers.SamplerSettings`' keys

Batches are {'x': (B, ...)} and optionally {'y': int (B,)} and {'mask': (B,)}. The loss draws t
from rngs['time'], eps from rngs['noise'] and the condition drop from rngs['label_drop']; in
evaluation (no rngs) it uses fixed keys, so the eval loss is comparable from one eval to the next.
"""

from __future__ import annotations

import jax

from jaxdl.generative import losses, samplers
from jaxdl.generative.settings import default_gen_config, parse_gen, path_from_config
from jaxdl.train.tasks import Family, Task, register_task

_EVAL_KEY = 20260101


def _make_task(config) -> Task:
  gen = parse_gen(config)
  path = path_from_config(config, gen)
  prediction, k, p_uncond = gen.prediction, gen.num_classes, gen.p_uncond

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    if not rngs:
      names = ("dropout", "noise", "time", "label_drop")
      rngs = dict(zip(names, jax.random.split(jax.random.PRNGKey(_EVAL_KEY), 4)))
    y_B = batch.get("y") if k else None
    if y_B is not None and train:
      y_B = losses.drop_condition(rngs["label_drop"], y_B, p_uncond, null_class=k)
    variables = {"params": params, **model_state}
    new_state = {"state": model_state}

    def predict(x_t, tm_B):
      if train and model_state:
        out, new_state["state"] = apply_fn(variables, x_t, tm_B, y=y_B, train=True,
                                           rngs={"dropout": rngs["dropout"]},
                                           mutable=list(model_state))
        return out, None
      if train:
        return apply_fn(variables, x_t, tm_B, y=y_B, train=True,
                        rngs={"dropout": rngs["dropout"]}), None
      return apply_fn(variables, x_t, tm_B, y=y_B, train=False), None

    loss, _, _ = losses.denoising_loss(predict, batch["x"], rngs["time"], rngs["noise"], path,
                                       prediction=prediction, mask_B=batch.get("mask"))
    return loss, ({}, new_state["state"])

  return Task(loss_fn)


@register_task("flow_matching", Family.GENERATIVE, path="flow", likelihood="ode")
def flow_matching(config, train_settings) -> Task:
  """Velocity MSE on x_t = t x + (1 - t) eps, t ~ U[0, 1]."""
  del train_settings
  return _make_task(config)


@register_task("ddpm", Family.GENERATIVE, path="ddpm", likelihood="ode")
def ddpm(config, train_settings) -> Task:
  """eps-MSE (or x0 / v) on x_t = sqrt(alpha_bar_t) x + sqrt(1 - alpha_bar_t) eps, t ~ U{1..T}."""
  del train_settings
  return _make_task(config)


@register_task("edm", Family.GENERATIVE, path="edm")
def edm(config, train_settings) -> Task:
  """Karras et al.'s loss: the MSE of F on the EDM path, ln sigma ~ N(p_mean, p_std^2)."""
  del train_settings
  return _make_task(config)


def make_run_sampler(config, model, *, return_trajectory=False, **overrides):
  """`make_sampler` for a trained run: the path and every sampler setting (prediction, classes,
  sampler, steps, guidance, ...) come from its `gen` section; `overrides` (keys of
  `samplers.SamplerSettings`) left None keep the run's values, guidance too: to sample a guided
  run without guidance, pass a copy of its config with `gen.guidance = None`.
  """
  gen = parse_gen(config)
  settings = samplers.SamplerSettings.pick(gen, **overrides)
  return samplers.make_sampler(model.apply, path_from_config(config, gen),
                               return_trajectory=return_trajectory, **vars(settings))


# Re-exported: experiments and the likelihood read them from here.
__all__ = ["default_gen_config", "path_from_config", "make_run_sampler"]
