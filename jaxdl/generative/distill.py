"""Step distillation of a flow model: a student whose one Euler step does k teacher steps.

The teacher's ODE dx/dt = v_T(x, t), t from 0 (noise) to 1 (data), is solved finely (Heun,
`substeps` per interval) from eps ~ N(0, I), and its states are kept on the grid t_g = g / G,
g = 0..G (`make_trajectories`). A student for n steps (n divides G) has Euler steps of size
h = 1/n between grid times t_i = i h; it regresses the teacher's chord over each interval,

  L(v_S) = E_{eps, i} || v_S(x_{t_i}, t_i) - (x_{t_{i+1}} - x_{t_i}) / h ||^2 / D,

so at the optimum n Euler steps of v_S from eps reproduce the teacher's (k = G/n * substeps
Heun steps each) states on its grid, and in particular its sample x_1 (`distill_loss`).
Unlike reflow (`jaxdl.generative.reflow`), which regresses x1 - eps at uniform random t along
the straight line, the student only sees the n grid times of its own sampler: one student per
step count, cheaper to fit but of no use at another count.

`train_distill` fine-tunes from the teacher's parameters (scanned updates, as reflow's).

Shapes: G grid intervals, N trajectories, B batch, D data dims.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxdl.generative import paths as paths_lib
from jaxdl.generative import reflow, samplers
from jaxdl.schema import POSITIVE, Settings, default_section, parse_section, setting


def make_trajectories(apply_fn: Callable, variables, rng, num: int, *, sample_shape,
                      grid: int = 4, substeps: int = 25, sampler: str = "heun", y_N=None,
                      guidance: float | None = None, num_classes: int = 0):
  """x_{G+1}xN...: the teacher's ODE states at t = g / grid from num noise draws (g = 0 first),
  `substeps` `sampler` steps per grid interval; for a class-conditional teacher, of the labels
  y_N (guided by `guidance` w when given: the student then learns the guided chords)."""
  sample = samplers.make_sampler(apply_fn, paths_lib.FlowPath(), sampler=sampler,
                                 steps=grid * substeps, sample_shape=sample_shape,
                                 guidance=guidance, num_classes=num_classes,
                                 return_trajectory=True)
  _, traj = sample(variables, rng, num, y=y_N)
  return traj[::substeps]


def chords(traj_GxN, steps: int, y_N=None):
  """(x_start, t_start, velocity, labels) of the `steps`-step student's intervals, flattened to
  rows: x_{t_i}, t_i = i / steps, (x_{t_{i+1}} - x_{t_i}) * steps, i = 0..steps-1, and each
  row's trajectory label (None for an unconditional teacher)."""
  grid = traj_GxN.shape[0] - 1
  if steps < 1 or grid % steps:
    raise ValueError(f"distill steps={steps}: must divide the trajectory grid {grid}")
  states = traj_GxN[::grid // steps]  # (steps + 1, N, ...)
  n = states.shape[1]
  x_start = states[:-1].reshape((steps * n,) + states.shape[2:])
  v_target = ((states[1:] - states[:-1]) * steps).reshape(x_start.shape)
  t_start = jnp.repeat(jnp.arange(steps, dtype=jnp.float32) / steps, n)
  y_rows = None if y_N is None else jnp.tile(jnp.asarray(y_N), steps)  # row i n + j: y_j
  return x_start, t_start, v_target, y_rows


def distill_loss(apply_fn: Callable, params, x_B, t_B, v_B, y_B=None):
  """mean || v_S(x, t[, y]) - v ||^2 / D over the rows."""
  out = apply_fn({"params": params}, x_B, t_B, **({} if y_B is None else {"y": y_B}),
                 train=False)
  err = (out.astype(jnp.float32) - v_B) ** 2
  return jnp.mean(err.reshape(err.shape[0], -1))


def make_distill_step(apply_fn: Callable, tx: optax.GradientTransformation,
                      batch: int) -> Callable:
  """`step((params, opt_state), ((x_R, t_R, v_R, y_R), key)) -> (carry, loss)`: one update on
  `batch` random rows of the chords (y_R None for an unconditional model)."""

  def step(carry, inputs):
    params, opt_state = carry
    (x_R, t_R, v_R, y_R), key = inputs
    rows_B = jax.random.randint(key, (batch,), 0, x_R.shape[0])
    y_B = None if y_R is None else y_R[rows_B]
    loss, grads = jax.value_and_grad(distill_loss, argnums=1)(apply_fn, params, x_R[rows_B],
                                                              t_R[rows_B], v_R[rows_B], y_B)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  return step


def train_distill(apply_fn: Callable, params, tx: optax.GradientTransformation, traj_GxN, *,
                  steps: int, student_steps: int, batch: int, rng, y_N=None):
  """Fine-tunes `params` into the `student_steps`-step student for `steps` updates (on the
  trajectories' labels y_N for a conditional model); returns (params, losses_steps)."""
  rows = chords(traj_GxN, student_steps, y_N)
  return reflow.scan_updates(make_distill_step(apply_fn, tx, batch), params, tx, rows,
                             steps=steps, rng=rng)


@dataclasses.dataclass(frozen=True)
class DistillSettings(Settings):
  """`config.distill`: the teacher's trajectories and the students' training."""
  prefix: ClassVar[str] = "distill."

  trajectories: int = setting(20_000, POSITIVE)  # N noise draws through the teacher
  grid: int = setting(4, POSITIVE)        # G intervals kept; every student count must divide it
  substeps: int = setting(25, POSITIVE)   # teacher Heun steps per interval (2 network calls)
  student_steps: tuple = (1, 2, 4)  # one student per count, each from the teacher's parameters
  steps: int = setting(2_000, POSITIVE)   # updates per student
  batch: int = setting(256, POSITIVE)
  lr: float = setting(5e-4, POSITIVE)     # peak lr of the run's optimizer rule

  def __post_init__(self):
    super().__post_init__()
    if not self.student_steps or any(int(n) < 1 or self.grid % int(n)
                                     for n in self.student_steps):
      self.fail("student_steps", f"expected divisors of grid={self.grid}, got "
                f"{self.student_steps!r}")


def default_distill_config() -> ml_collections.ConfigDict:
  """`config.distill` with every key at its default."""
  return default_section(DistillSettings)


def parse_distill(config) -> DistillSettings:
  """`config.distill` as checked `DistillSettings` (one-line errors naming the key)."""
  return parse_section(config.distill, DistillSettings)
