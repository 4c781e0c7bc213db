"""Tests for jaxdl.generative.distill with a linear teacher, where every quantity is closed-form.

Teacher v_T(x, t) = a x. One Heun step of size d multiplies x by r = 1 + a d + (a d)^2 / 2, so a
grid interval of the n-step student (m = G / n * substeps Heun steps) takes x to r^m x, and the
student's target velocity there is (r^m - 1) n x: a linear student v_S = w x fits it exactly at
w* = (r^m - 1) n, and its n Euler steps from eps land on the teacher's sample r^(G substeps) eps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.generative import distill

A, GRID, SUBSTEPS = -0.7, 4, 5


def teacher(variables, x_t, t, y=None, train=False):
  del variables, t, y, train
  return A * x_t


def student(variables, x_t, t_B, train=False):
  del t_B, train
  return variables["params"]["w"] * x_t


@pytest.fixture(scope="module")
def traj():
  return distill.make_trajectories(teacher, None, jax.random.PRNGKey(0), 256, sample_shape=(3,),
                                   grid=GRID, substeps=SUBSTEPS)


def test_trajectories_are_the_teachers_heun_states_on_the_grid(traj):
  r = 1 + A / (GRID * SUBSTEPS) + (A / (GRID * SUBSTEPS)) ** 2 / 2
  assert traj.shape == (GRID + 1, 256, 3)
  for g in range(GRID + 1):
    np.testing.assert_allclose(traj[g], r ** (g * SUBSTEPS) * traj[0], rtol=1e-5)


def test_linear_student_fits_the_teacher_chords_exactly(traj, steps=2):
  r = 1 + A / (GRID * SUBSTEPS) + (A / (GRID * SUBSTEPS)) ** 2 / 2
  w_star = (r ** (GRID // steps * SUBSTEPS) - 1) * steps
  params, losses = distill.train_distill(student, {"w": jnp.zeros(())}, optax.adam(0.05), traj,
                                         steps=300, student_steps=steps, batch=64,
                                         rng=jax.random.PRNGKey(1))
  np.testing.assert_allclose(float(params["w"]), w_star, atol=1e-3)
  assert float(losses[-1]) < 1e-5 < float(losses[0])
  x = traj[0]
  for i in range(steps):  # the student's own Euler sampler lands on the teacher's sample
    x = x + student({"params": params}, x, jnp.full((x.shape[0],), i / steps)) / steps
  np.testing.assert_allclose(x, traj[-1], atol=2e-3)


def test_student_steps_must_divide_the_grid(traj):
  with pytest.raises(ValueError, match="distill steps=3: must divide the trajectory grid 4"):
    distill.chords(traj, 3)


def test_bad_distill_settings_are_one_line_errors_naming_the_key():
  import ml_collections  # pylint: disable=g-import-not-at-top
  for key, value in (("trajectories", 0), ("lr", float("nan")), ("student_steps", (3,))):
    config = ml_collections.ConfigDict({"distill": distill.default_distill_config().to_dict()})
    config.distill[key] = value
    with pytest.raises(ValueError, match=f"distill.{key}: "):
      distill.parse_distill(config)


RATES = jnp.array([-0.7, -0.2])  # a class-conditional teacher: v_T(x, t, y) = a_y x


def conditional_teacher(variables, x_t, t, y=None, train=False):
  del variables, t, train
  return RATES[y][:, None] * x_t


def conditional_student(variables, x_t, t_B, y=None, train=False):
  del t_B, train
  return variables["params"]["w"][y][:, None] * x_t


def test_a_conditional_student_learns_each_class_chord_from_its_own_rows(steps=2):
  """Trajectories of labels y_N, chords tiled with them: the per-class linear student w_y x
  must reach each class's own w*_y = (r_y^m - 1) n (swapped labels would exchange them)."""
  y_N = jnp.arange(256) % 2
  traj = distill.make_trajectories(conditional_teacher, None, jax.random.PRNGKey(0), 256,
                                   sample_shape=(3,), grid=GRID, substeps=SUBSTEPS, y_N=y_N,
                                   num_classes=2)
  d = 1 / (GRID * SUBSTEPS)
  r_y = 1 + RATES * d + (RATES * d) ** 2 / 2
  np.testing.assert_allclose(traj[-1], r_y[y_N][:, None] ** (GRID * SUBSTEPS) * traj[0],
                             rtol=1e-5)
  params, _ = distill.train_distill(conditional_student, {"w": jnp.zeros((2,))},
                                    optax.adam(0.05), traj, steps=300, student_steps=steps,
                                    batch=64, rng=jax.random.PRNGKey(1), y_N=y_N)
  np.testing.assert_allclose(params["w"], (r_y ** (GRID // steps * SUBSTEPS) - 1) * steps,
                             atol=1e-3)
