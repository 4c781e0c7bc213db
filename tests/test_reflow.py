"""Tests for jaxdl.generative.reflow on Gaussian data, where the teacher's field is exact.

Data N(mu, s^2), eps ~ N(0, 1): the exact flow's ODE maps eps to x1 = mu + s eps along the curve
y(t) = t mu + sqrt(t^2 s^2 + (1 - t)^2) eps. The coupled pairs' straight lines
y = t x1 + (1 - t) eps = t mu + (t s + 1 - t) eps do not cross (t s + 1 - t > 0), so the reflowed
field is v_1(y, t) = x1 - eps = mu + (s - 1) eps(y, t) with eps(y, t) = (y - t mu) / (t s + 1 - t),
and one Euler step from eps lands exactly on x1.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxdl import models as jmodels
from jaxdl.generative import closed_forms, reflow

MU, S = 1.5, 0.5


def teacher(variables, x_t, t_B, y=None, train=False):
  del variables, y, train
  return closed_forms.gaussian_flow_velocity(x_t, jnp.reshape(t_B, (-1, 1)), MU, S)


def reflowed(variables, x_t, t_B, train=False):
  del variables, train
  t = jnp.reshape(t_B, (-1, 1))
  return MU + (S - 1) * (x_t - t * MU) / (t * S + 1 - t)


@pytest.fixture(scope="module")
def pairs():
  return reflow.make_pairs(teacher, None, jax.random.PRNGKey(0), 512, sample_shape=(1,),
                           steps=50)


def test_pairs_follow_the_teacher_ode_and_only_the_reflowed_field_fits_them(pairs):
  eps_N, x1_N = pairs
  np.testing.assert_allclose(x1_N, MU + S * eps_N, atol=1e-3)  # Heun, 50 steps: O(h^2)
  key = jax.random.PRNGKey(1)
  # The straight field fits the coupled pairs exactly; the teacher's curved field does not.
  assert float(reflow.reflow_loss(reflowed, None, eps_N, x1_N, key)) < 1e-6  # Heun error^2
  assert float(reflow.reflow_loss(teacher, None, eps_N, x1_N, key)) > 0.01


def _mu(y):
  """Class-conditional data: N(+mu, s^2) for y = 1, N(-mu, s^2) for y = 0."""
  return jnp.reshape(MU * (2.0 * y - 1.0), (-1, 1))


def conditional_teacher(variables, x_t, t_B, y=None, train=False):
  del variables, train
  return closed_forms.gaussian_flow_velocity(x_t, jnp.reshape(t_B, (-1, 1)), _mu(y), S)


def conditional_reflowed(params, x_t, t_B, y=None, train=False):
  """The exact reflowed field of each class, plus 0 * w so that it has a parameter to update."""
  del train
  t, mu = jnp.reshape(t_B, (-1, 1)), _mu(y)
  return mu + (S - 1) * (x_t - t * mu) / (t * S + 1 - t) + 0.0 * params["params"]["w"]


def test_conditional_pairs_keep_each_row_with_its_label():
  """A class-conditional teacher draws x1 for the given labels, and train_reflow feeds every
  batch row its own label: the exact per-class reflowed field has ~0 loss on every update, and
  ~(2 mu t)^2-sized loss when the labels are shuffled against the pairs."""
  y_N = jnp.arange(512) % 2
  eps_N, x1_N = reflow.make_pairs(conditional_teacher, None, jax.random.PRNGKey(0), 512,
                                  sample_shape=(1,), steps=50, y_N=y_N, num_classes=2)
  np.testing.assert_allclose(x1_N, _mu(y_N) + S * eps_N, atol=1e-3)
  params = {"w": jnp.zeros(())}
  for labels, bound in ((y_N, lambda l: l.max() < 1e-6), (1 - y_N, lambda l: l.min() > 0.01)):
    _, losses = reflow.train_reflow(conditional_reflowed, params, optax.sgd(0.0), eps_N, x1_N,
                                    steps=20, batch=64, rng=jax.random.PRNGKey(1), y_N=labels)
    assert bound(losses), losses


STUDENT = dict(name="denoiser_mlp", hidden=32, depth=1, emb_dim=16)


@pytest.fixture(scope="module")
def student(pairs):
  """(model, params, losses) of a small student trained 200 updates on the pairs."""
  eps_N, x1_N = pairs
  model = jmodels.build_model(ml_collections.ConfigDict(STUDENT))
  params = jax.jit(model.init, static_argnames="train")(
      jax.random.PRNGKey(2), eps_N[:1], jnp.zeros((1,)), train=False)["params"]
  params, losses = reflow.train_reflow(model.apply, params, optax.adam(3e-3), eps_N, x1_N,
                                       steps=200, batch=64, rng=jax.random.PRNGKey(3))
  return model, params, losses


def test_a_student_trained_on_the_pairs_gets_closer_in_one_euler_step(pairs, student):
  eps_N, x1_N = pairs
  model, params, losses = student
  assert float(losses[-20:].mean()) < 0.2 * float(losses[:20].mean())
  # One Euler step x1 ~ eps + v(eps, 0). The teacher's lands on E[x] = mu for every eps (its error
  # is s |eps|, ~0.4 on average); the student's must be far closer to each pair's x1.
  one_step = jax.jit(lambda p, e: e + model.apply({"params": p}, e, jnp.zeros((1,)),
                                                   train=False))(params, eps_N)
  teacher_err = float(jnp.mean(jnp.abs(eps_N + teacher(None, eps_N, jnp.zeros((1,))) - x1_N)))
  np.testing.assert_allclose(teacher_err, S * np.mean(np.abs(eps_N)), rtol=1e-3)
  assert float(jnp.mean(jnp.abs(one_step - x1_N))) < 0.25 * teacher_err


def test_a_saved_student_samples_in_one_step_through_jaxdl_sample(student, tmp_path, capsys):
  """`evaluation.save_run` makes the student a run of its own; `jaxdl sample --steps 1` (its
  default, Euler) draws N(mu, s^2) from it, where the teacher's one step gives E[x] = mu only."""
  from jaxdl import cli
  from jaxdl.config import load_config
  from jaxdl.generative import evaluation
  model, params, _ = student
  config = load_config("fm_toy2d:smoke")[0]
  config.model.update(STUDENT)
  config.gen.sample_shape = (1,)
  run_dir = evaluation.save_run(tmp_path / "student", config, params, step=200, sampler="euler",
                                steps=1)
  out = tmp_path / "x.npy"
  assert cli.main(["sample", str(run_dir), "--steps", "1", "--num", "512", "--out", str(out)]) == 0
  x_N = np.load(out)[:, 0]
  assert x_N.shape == (512,)
  assert abs(x_N.mean() - MU) < 0.1 and abs(x_N.std() - S) < 0.1, (x_N.mean(), x_N.std())
  # The same draw without --steps: the saved run's own default is Euler at 1 step.
  assert cli.main(["sample", str(run_dir), "--num", "512", "--out", str(tmp_path / "d.npy")]) == 0
  np.testing.assert_array_equal(np.load(tmp_path / "d.npy")[:, 0], x_N)
  # The workdir now holds a run: a second save is refused rather than overwriting it.
  with pytest.raises(ValueError, match="already holds a run"):
    evaluation.save_run(run_dir, config, params, step=200)


def test_bad_reflow_settings_are_one_line_errors_naming_the_key():
  for key, value in (("pairs", 0), ("lr", -1.0), ("teacher_sampler", "rk9"), ("eval_steps", ())):
    config = ml_collections.ConfigDict({"reflow": reflow.default_reflow_config().to_dict()})
    config.reflow[key] = value
    with pytest.raises(ValueError, match=f"reflow.{key}: "):
      reflow.parse_reflow(config)
