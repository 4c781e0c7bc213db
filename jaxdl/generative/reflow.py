"""Reflow (Liu et al., 2022): straighten a trained flow by retraining it on its own couplings.

Flow matching on independent pairs (eps, x) learns v_0(y, t) = E[x - eps | x_t = y]; where the
straight lines t x + (1 - t) eps of different pairs cross, the average turns and the ODE paths
curve, so few Euler steps land off the data (one step lands on E[x], the mean). Reflow draws
couplings from the teacher's own ODE,

  eps ~ N(0, I),   x1 = ODE_{v_0}(eps) from t = 0 to 1     (`make_pairs`, Heun, many steps),

and trains v_1 on the same regression with the coupled pairs (`reflow_loss`),

  L(v_1) = E_{t ~ U[0,1], (eps, x1)} || v_1(t x1 + (1 - t) eps, t) - (x1 - eps) ||^2 / D.

The coupling is deterministic and the teacher's paths do not cross, so the lines of the new pairs
cross less and v_1's paths are straighter: Euler with 1-2 steps gets close to many-step quality.
The marginal at t = 1 stays that of the teacher (the pairs' x1 follow the teacher's samples).

`train_reflow` fine-tunes from the teacher's parameters (Liu et al. do the same) with a pure
step (`make_reflow_step`) scanned over the steps as one program; batches are random rows of the
pair arrays drawn from `fold_in(rng, step)`.

Shapes: N pairs, B batch, D data dims.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxdl.generative import paths as paths_lib
from jaxdl.generative import samplers
from jaxdl.optim import parse_optim
from jaxdl.schema import POSITIVE, Check, Settings, default_section, one_of, parse_section, setting


def make_pairs(apply_fn: Callable, variables, rng, num: int, *, sample_shape, steps: int = 100,
               sampler: str = "heun", y_N=None, guidance: float | None = None,
               num_classes: int = 0):
  """(eps_N..., x1_N...): noise and where the teacher's ODE takes it (`sampler`, `steps`).

  A class-conditional teacher draws x1 for the labels `y_N` (guided by `guidance` w when given),
  so the student learns the coupling (eps, y) -> x1 and needs no guidance of its own.
  """
  eps = jax.random.normal(rng, (num,) + tuple(sample_shape), jnp.float32)
  sample = samplers.make_sampler(apply_fn, paths_lib.FlowPath(), sampler=sampler, steps=steps,
                                 sample_shape=sample_shape, guidance=guidance,
                                 num_classes=num_classes)
  return eps, sample(variables, rng, num, y=y_N, x_init=eps)


def reflow_loss(apply_fn: Callable, params, eps_B, x1_B, rng_time, y_B=None):
  """E_t || v(t x1 + (1 - t) eps, t[, y]) - (x1 - eps) ||^2 / D for the given coupled pairs."""
  t_B = jax.random.uniform(rng_time, (eps_B.shape[0],))
  x_t = paths_lib.add_noise(x1_B, eps_B, t_B, 1.0 - t_B)
  out = apply_fn({"params": params}, x_t, t_B, **({} if y_B is None else {"y": y_B}),
                 train=False)
  err = (out.astype(jnp.float32) - (x1_B - eps_B)) ** 2
  return jnp.mean(err.reshape(err.shape[0], -1))


def make_reflow_step(apply_fn: Callable, tx: optax.GradientTransformation, batch: int) -> Callable:
  """`step((params, opt_state), ((eps_N, x1_N, y_N), key)) -> ((params, opt_state), loss)`: one
  update on `batch` random pairs (rows drawn with `key`), t from the same key; y_N is None for an
  unconditional model."""

  def step(carry, inputs):
    params, opt_state = carry
    (eps_N, x1_N, y_N), key = inputs
    k_rows, k_time = jax.random.split(key)
    rows_B = jax.random.randint(k_rows, (batch,), 0, eps_N.shape[0])
    y_B = None if y_N is None else y_N[rows_B]
    loss, grads = jax.value_and_grad(reflow_loss, argnums=1)(apply_fn, params, eps_N[rows_B],
                                                             x1_N[rows_B], k_time, y_B)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  return step


def scan_updates(step: Callable, params, tx: optax.GradientTransformation, data, *, steps: int,
                 rng):
  """Runs `step(carry, (data, fold_in(rng, s)))` for s < steps as one jitted scan from
  (params, tx.init(params)); returns (params, losses_steps). Shared by reflow and distillation."""

  @jax.jit
  def run(params, data):
    def body(carry, s):
      return step(carry, (data, jax.random.fold_in(rng, s)))
    (params, _), losses = jax.lax.scan(body, (params, tx.init(params)), jnp.arange(steps))
    return params, losses

  return run(params, data)


def student_optimizer(config, lr: float, steps: int) -> optax.GradientTransformation:
  """The run's optimizer rule (`config.optim`) at peak `lr` over `steps` updates: the optax
  transformation of the few-step students (reflow and distillation) trained from a run."""
  optim = config.optim.to_dict()
  optim["lr"] = lr
  return parse_optim(optim).build(steps)[0]


def train_reflow(apply_fn: Callable, params, tx: optax.GradientTransformation, eps_N, x1_N, *,
                 steps: int, batch: int, rng, y_N=None):
  """Fine-tunes `params` on the pairs (with their labels y_N for a conditional model) for
  `steps` updates; returns (params, losses_steps)."""
  return scan_updates(make_reflow_step(apply_fn, tx, batch), params, tx, (eps_N, x1_N, y_N),
                      steps=steps, rng=rng)


@dataclasses.dataclass(frozen=True)
class ReflowSettings(Settings):
  """`config.reflow`: how many pairs, how the teacher draws them, how long the student trains."""
  prefix: ClassVar[str] = "reflow."

  pairs: int = setting(20_000, POSITIVE)   # N couplings (eps, x1)
  teacher_sampler: str = setting("heun", one_of(*samplers.SAMPLERS))
  teacher_steps: int = setting(100, POSITIVE)  # ODE steps per pair (Heun: 2 network calls each)
  steps: int = setting(2_000, POSITIVE)    # student updates, from the teacher's parameters
  batch: int = setting(256, POSITIVE)
  lr: float = setting(5e-4, POSITIVE)      # peak lr of the run's optimizer rule for the student
  # Euler steps at which teacher and student are compared
  eval_steps: tuple = setting((1, 2, 4), Check(lambda v: len(v) > 0 and min(map(int, v)) >= 1,
                                               "expected step counts >= 1"))


def default_reflow_config() -> ml_collections.ConfigDict:
  """`config.reflow` with every key at its default."""
  return default_section(ReflowSettings)


def parse_reflow(config) -> ReflowSettings:
  """`config.reflow` as checked `ReflowSettings` (one-line errors naming the key)."""
  return parse_section(config.reflow, ReflowSettings)
