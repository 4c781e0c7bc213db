"""`jaxdl reproduce` claims of the generative-model lecture (issue 17)."""

from __future__ import annotations

import numpy as np

from jaxdl.course.rows import Row, claim, close


@claim("distill_one_step")
def distill_one_step() -> list[Row]:
  """1-D Gaussian data, exact flow: Euler@1 collapses to the mean (FD = s^2); a distilled
  1-call student reaches the teacher's Heun@100 (FD ~ 0)."""
  import jax
  import jax.numpy as jnp
  import optax
  from jaxdl.generative import closed_forms, distill, metrics
  mu, s = 1.5, 0.5

  def teacher(variables, x_t, t, y=None, train=False):
    del variables, y, train
    return closed_forms.gaussian_flow_velocity(x_t, jnp.reshape(t, (-1, 1)), mu, s)

  def student(variables, x_t, t_B, train=False):  # affine in x: the exact 1-step map is affine
    del t_B, train
    return variables["params"]["a"] + variables["params"]["b"] * x_t

  traj = distill.make_trajectories(teacher, None, jax.random.PRNGKey(0), 4096, sample_shape=(1,),
                                   grid=1, substeps=100)
  eps, teacher_x1 = np.asarray(traj[0]), np.asarray(traj[-1])
  params, _ = distill.train_distill(student, {"a": jnp.zeros(()), "b": jnp.zeros(())},
                                    optax.adam(0.05), traj, steps=400, student_steps=1,
                                    batch=256, rng=jax.random.PRNGKey(1))
  one_call = lambda v: eps + np.asarray(v(None if v is teacher else {"params": params},  # noqa: E731
                                          jnp.asarray(eps), jnp.zeros((len(eps),))))
  target = (np.array([mu]), np.array([[s ** 2]]))

  def fd(x):  # against the data distribution itself, in closed form
    return metrics.frechet_gaussian(x.mean(0), np.cov(x, rowvar=False).reshape(1, 1), *target)

  return [close("distill_one_step.teacher_euler1_frechet", s ** 2, fd(one_call(teacher)),
                atol=1e-6),
          close("distill_one_step.teacher_heun100_frechet", 0.0, fd(teacher_x1), atol=2e-3),
          close("distill_one_step.student_euler1_frechet", 0.0, fd(one_call(student)), atol=2e-3)]
