"""Gaussian-path samplers one update at a time: the jitted step `make_sampler` scans over
(`make_step`, which `jaxdl bench sampler` times per network call), and a Python loop over it
(`make_python_loop_sampler`), the reference the single-scan sampler is tested against: same
settings (`samplers.SamplerSettings`), same keys, same samples, one dispatch per step.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxdl.generative import samplers, solvers


def make_step(apply_fn: Callable, path, **settings):
  """The jitted update `step(variables, x, i, key, y_B) -> x` that `make_sampler` with the same
  settings scans over i = 0..N-1 (one denoiser call plus the update; two calls for Heun); for a
  multistep rule `step(variables, (x, hist), i, key, y_B) -> (x, hist)`, hist starting as
  `solvers.init_history(x, samplers.SAMPLERS[sampler].history)`."""
  _, step_fn, rule, _ = samplers.build_parts(apply_fn, path,
                                             samplers.SamplerSettings.of(**settings))
  if rule.history:
    return jax.jit(step_fn)
  return jax.jit(lambda variables, x, i, key, y_B: step_fn(variables, (x, ()), i, key, y_B)[0])


def make_python_loop_sampler(apply_fn: Callable, path, **settings):
  """The same sampler as a Python loop over the jitted `make_step` (for tests).

  Same settings and same samples as `make_sampler` (same keys, same update), one dispatch per
  step.
  """
  config = samplers.SamplerSettings.of(**settings)
  init_fn, _, rule, _ = samplers.build_parts(apply_fn, path, config)
  step_jit = make_step(apply_fn, path, **settings)
  init_jit = jax.jit(init_fn, static_argnums=(1,))

  def sample(variables, rng, num: int, y=None, x_init=None):
    y_B = samplers.check_labels(y, int(num), config.num_classes)
    k_init, k_loop = jax.random.split(rng)
    x = init_jit(k_init, int(num)) if x_init is None else jnp.asarray(x_init, jnp.float32)
    carry = (x, solvers.init_history(x, rule.history))
    for i in range(config.steps):
      key = jax.random.fold_in(k_loop, i)
      carry = (step_jit(variables, carry, jnp.asarray(i), key, y_B) if rule.history
               else (step_jit(variables, carry[0], jnp.asarray(i), key, y_B), ()))
    return carry[0] * path.data_scale

  return sample
