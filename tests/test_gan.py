"""Tests for jaxdl.generative.gan: the one-objective step gives each player its own gradient,
known loss values, the R1 penalty of a linear discriminator, and the mode-coverage count."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models as jmodels
from jaxdl.generative import gan
from jaxdl.train import tasks


def _config(hidden, r1):
  return ml_collections.ConfigDict(dict(
      task="gan", model=dict(name="gan", data_shape=(2,), latent=3, hidden=hidden),
      gen=dict(r1=r1, sample_shape=(2,), eval_num=10)))


@pytest.fixture(scope="module")
def setup():
  config = _config((8,), 0.5)
  model = jmodels.build_model(config.model)
  x_Bx2 = jax.random.normal(jax.random.PRNGKey(0), (16, 2))
  params = jax.jit(model.init, static_argnames="train")(jax.random.PRNGKey(1), x_Bx2,
                                                        train=False)["params"]
  return config, model, params, x_Bx2


def test_the_joint_objective_gives_each_player_the_gradient_of_its_own_loss(setup):
  config, model, params, x_Bx2 = setup
  z_BxZ = jax.random.normal(jax.random.PRNGKey(2), (16, 3))
  batch = {"x": x_Bx2}

  @jax.jit
  def both(params):
    joint = jax.grad(lambda p: gan.gan_objective(model.apply, p, x_Bx2, z_BxZ, 0.5, batch)[0])
    own_d = jax.grad(lambda p: gan.gan_losses(model.apply, p, x_Bx2, z_BxZ, 0.5, batch)[0])
    own_g = jax.grad(lambda p: gan.gan_losses(model.apply, p, x_Bx2, z_BxZ, 0.5, batch)[1])
    return joint(params), own_d(params), own_g(params)

  joint, own_d, own_g = both(params)
  for a, b in ((joint["discriminator"], own_d["discriminator"]),
               (joint["generator"], own_g["generator"])):
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-7), a, b)
  # and L_G does move the discriminator (so the stop-gradient is what keeps it out)
  assert max(float(jnp.abs(v).max()) for v in jax.tree.leaves(own_g["discriminator"])) > 1e-4
  # the task's loss is L_D + L_G, with both in the metrics
  loss, (metrics, _) = tasks.make_task(config).loss_fn(model.apply, params, {}, batch,
                                                       {"noise": jax.random.PRNGKey(3)}, True)
  np.testing.assert_allclose(loss, metrics["loss_d"] + 0.25 * metrics["r1_penalty"]
                             + metrics["loss_g"], rtol=1e-6)


def test_known_values_blind_discriminator_and_r1_of_a_linear_one():
  config = _config((), 2.0)  # hidden=(): D(x) = w.x + b, so ||grad_x D||^2 = |w|^2 everywhere
  model = jmodels.build_model(config.model)
  x_Bx2 = jax.random.normal(jax.random.PRNGKey(4), (32, 2))
  params = jax.jit(model.init, static_argnames="train")(jax.random.PRNGKey(5), x_Bx2,
                                                        train=False)["params"]
  z_BxZ = jax.random.normal(jax.random.PRNGKey(6), (32, 3))
  losses = jax.jit(lambda p: gan.gan_losses(model.apply, p, x_Bx2, z_BxZ, 2.0, {"x": x_Bx2}))
  w_2 = params["discriminator"]["Dense_0"]["kernel"][:, 0]
  _, _, metrics = losses(params)
  np.testing.assert_allclose(metrics["r1_penalty"], jnp.sum(w_2**2), rtol=1e-5)
  # D = 0 everywhere: L_D = 2 ln 2 (+ no penalty), L_G = ln 2
  loss_d, loss_g, _ = losses({**params, "discriminator": jax.tree.map(jnp.zeros_like,
                                                                      params["discriminator"])})
  np.testing.assert_allclose([loss_d, loss_g], [2 * np.log(2), np.log(2)], rtol=1e-6)


def test_modes_covered_counts_modes_with_their_share():
  centres_Mx2 = np.stack([np.cos(np.arange(8) * np.pi / 4), np.sin(np.arange(8) * np.pi / 4)], 1)
  rng = np.random.default_rng(0)
  # 7 modes of 8 get 100 points each (one gets only 10: under a quarter of its fair share)
  idx_N = np.concatenate([np.repeat(np.arange(7), 100), np.full(10, 7)])
  x_Nx2 = centres_Mx2[idx_N] + 0.05 * rng.standard_normal((len(idx_N), 2))
  out = gan.modes_covered(np.concatenate([x_Nx2, [[5.0, 5.0]]]), centres_Mx2, radius=0.3)
  assert out["covered"] == 7 and out["counts"] == [100] * 7 + [10]
  np.testing.assert_allclose(out["near_fraction"], 710 / 711)
