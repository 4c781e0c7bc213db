"""Denoising losses on a Gaussian path, and condition dropout for classifier-free guidance.

For data x_B..., eps ~ N(0, I) and a time t drawn by the path (t ~ U[0, 1] for the flow,
t ~ U{1..T} for DDPM), x_t = alpha_t x + sigma_t eps and the loss is the unweighted MSE

  L = E || out(x_t, t, y) - target ||^2 / D,   D = the number of data dims per example,

with target = eps (the DDPM loss, a reweighted ELBO), x (x0 prediction),
alpha eps - sigma x (v prediction) or x - eps (flow matching velocity; its minimiser is
v*(y, t) = E[x - eps | x_t = y]). Examples with batch['mask'] = 0 (padding) do not count.
On the EDM path (`paths.EDMPath`, t = sigma ~ log-normal) the data enter as x / sigma_data and the
target of prediction 'edm' is F = sigma x - alpha eps: the unweighted MSE of F is Karras et al.'s
weighted loss lambda(sigma) ||D - x||^2 / D, since D - x = c_out (F - F_target) and
lambda = 1 / c_out^2 (`paths.EDMPath`).

Shapes: B batch; x_B... a batch with any trailing data dims.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxdl.generative import paths as paths_lib
from jaxdl.train.token_losses import masked_mean


def drop_condition(rng, y_B, p_uncond: float, null_class: int):
  """Replaces each label by the null class with probability p_uncond (classifier-free training)."""
  if p_uncond <= 0:
    return y_B
  drop_B = jax.random.bernoulli(rng, p_uncond, y_B.shape)
  return jnp.where(drop_B, jnp.asarray(null_class, y_B.dtype), y_B)


def denoising_loss(predict_fn: Callable, x, rng_time, rng_noise, path, *, prediction: str,
                   mask_B=None):
  """The path's regression loss for one batch.

  Args:
    predict_fn: `predict_fn(x_t, tm_B) -> (out, aux)`, the network at model time tm_B.
    x: clean data x_B....
    rng_time, rng_noise: keys for t and eps.
    path: `paths.FlowPath()` or a `paths.DDPMPath`.
    prediction: the target, one of `path.predictions` (see `paths.from_x_eps`).
    mask_B: optional 1/0 weights per example.

  Returns:
    (loss, per_example_B, aux): loss the masked mean of the per-example MSE.
  """
  paths_lib.check_prediction(prediction, path)  # a target off its path trains the wrong field
  x = x.astype(jnp.float32) / path.data_scale
  t_B = path.sample_train_time(rng_time, x.shape[0])
  eps = jax.random.normal(rng_noise, x.shape, jnp.float32)
  alpha_B, sigma_B = path.alpha_sigma(t_B)
  x_t = paths_lib.add_noise(x, eps, alpha_B, sigma_B)
  target = paths_lib.from_x_eps(x, eps, alpha_B, sigma_B, prediction)
  out, aux = predict_fn(x_t, path.model_time(t_B).astype(jnp.float32))
  err = (out.astype(jnp.float32) - target) ** 2
  per_example_B = jnp.mean(err.reshape(err.shape[0], -1), axis=1)
  loss = masked_mean(per_example_B, {} if mask_B is None else {"mask": mask_B})
  return loss, per_example_B, aux


def flow_matching_loss(predict_fn, x, rng_time, rng_noise, mask_B=None):
  """Velocity MSE E||v(x_t, t) - (x - eps)||^2 / D, x_t = t x + (1 - t) eps, t ~ U[0, 1]."""
  return denoising_loss(predict_fn, x, rng_time, rng_noise, paths_lib.FlowPath(),
                        prediction="velocity", mask_B=mask_B)


def ddpm_loss(predict_fn, x, rng_time, rng_noise, path, prediction="eps", mask_B=None):
  """E||out(x_t, t) - target||^2 / D on a DDPM path; target eps by default (Ho et al., 2020)."""
  return denoising_loss(predict_fn, x, rng_time, rng_noise, path, prediction=prediction,
                        mask_B=mask_B)
