"""Tests for jaxdl.generative.gan: the one-objective step gives each player its own gradient,
known loss values, the R1 penalty of a linear discriminator, the two players' chains
(per-player lr, alternating updates whose G step sees the updated D), and the mode-coverage
count."""

import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxdl import models as jmodels
from jaxdl.generative import gan
from jaxdl.optim import parse_optim
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


def _sgd_players(updates, g_lr, d_lr, total_steps=10):
  """The task's two-player optimizer over plain SGD at a constant lr (update = -lr g)."""
  settings = gan.GANSettings(updates=updates, g_lr=g_lr, d_lr=d_lr)
  optim = parse_optim(dict(name="sgd", lr=1.0, weight_decay=0.0, clip_norm=None,
                           schedule=dict(name="constant")))
  return gan.player_optimizers(settings)(optim, total_steps)


def test_simultaneous_updates_use_each_players_own_lr(setup):
  _, model, params, x_Bx2 = setup
  z_BxZ = jax.random.normal(jax.random.PRNGKey(7), (16, 3))
  grad = jax.jit(jax.grad(lambda p: gan.gan_objective(model.apply, p, x_Bx2, z_BxZ, 0.5,
                                                      {"x": x_Bx2})[0]))
  tx, schedule = _sgd_players("simultaneous", 0.1, 0.3)
  g_0 = grad(params)
  updates, _ = tx.update(g_0, tx.init(params), params)
  for player, lr in (("generator", 0.1), ("discriminator", 0.3)):
    jax.tree.map(lambda u, g: np.testing.assert_allclose(u, -lr * g, rtol=1e-6),
                 updates[player], g_0[player])
  assert float(schedule(5)) == 0.3  # the logged lr is the discriminator's


def test_alternating_updates_move_d_then_g_at_the_updated_d(setup):
  _, model, params_0, x_Bx2 = setup
  z_BxZ = jax.random.normal(jax.random.PRNGKey(8), (16, 3))
  batch = {"x": x_Bx2}
  grad = jax.jit(jax.grad(lambda p: gan.gan_objective(model.apply, p, x_Bx2, z_BxZ, 0.0,
                                                      batch)[0]))
  grad_g = jax.jit(jax.grad(lambda p: gan.gan_losses(model.apply, p, x_Bx2, z_BxZ, 0.0,
                                                     batch)[1]))
  tx, schedule = _sgd_players("alternating", 0.5, 0.5)
  state = tx.init(params_0)
  steps, params = [], params_0
  for _ in range(2):
    updates, state = tx.update(grad(params), state, params)
    params = optax.apply_updates(params, updates)
    steps.append(params)
  params_1, params_2 = steps
  same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  same(params_1["generator"], params_0["generator"])          # k = 0: only D moved
  assert _max_diff(params_1["discriminator"], params_0["discriminator"]) > 1e-4
  same(params_2["discriminator"], params_1["discriminator"])  # k = 1: only G moved ...
  # ... by its own loss's gradient at the D of step 1, not the D it started with.
  expect = jax.tree.map(lambda p, g: p - 0.5 * g, params_0["generator"],
                        grad_g(params_1)["generator"])
  stale = jax.tree.map(lambda p, g: p - 0.5 * g, params_0["generator"],
                       grad_g(params_0)["generator"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               params_2["generator"], expect)
  assert _max_diff(params_2["generator"], stale) > 1e3 * _max_diff(params_2["generator"], expect)
  assert int(state.count) == 2 and float(schedule(3)) == 0.5


def _max_diff(a, b):
  return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("key, value, match", [
    ("updates", "both", "gen.updates: expected one of"),
    ("d_lr", -1.0, "gen.d_lr: must be >= 0, got -1.0$"),
    ("g_b2", 1.0, r"gen.g_b2: must be in \[0, 1\)"),
])
def test_bad_player_settings_are_one_line_errors_naming_the_key(key, value, match):
  config = _config((8,), 0.0)
  config.gen[key] = value
  with pytest.raises(ValueError, match=match) as e:
    tasks.make_task(config)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="gen.d_b1: optimizer 'sgd' has no Adam moments"):
    gan.player_optimizers(gan.GANSettings(d_b1=0.5))(parse_optim(dict(name="sgd")), 10)


@pytest.fixture(scope="module")
def gan_run(tmp_path_factory):
  """gan_toy2d:smoke on the engine for 4 steps: alternating, per-player settings, ckpt at 2, 4."""
  from jaxdl.config import load_config
  from jaxdl.train import run
  workdir = tmp_path_factory.mktemp("gan_run")
  config, _ = load_config("gan_toy2d:smoke", [
      "train.plot=False", "train.steps=4", "train.eval_every=4", "train.ckpt_every=2",
      "gen.updates=alternating", "gen.g_lr=2e-3", "gen.d_b1=0.0"])
  run(config, workdir, progress=False)
  return config, workdir


@pytest.mark.slow
def test_an_alternating_run_resumes_bit_exactly(gan_run):
  from jaxdl.train import run
  from jaxdl.train.checkpoint import load_state
  config, workdir = gan_run
  step, full = load_state(workdir)
  assert step == 4 and int(full["opt_state"]["count"]) == 4
  shutil.rmtree(workdir / "checkpoints" / "4")
  run(config, workdir, progress=False)  # resumes at step 2 and trains steps 2, 3 again
  step, resumed = load_state(workdir)
  assert step == 4
  jax.tree.map(np.testing.assert_array_equal, resumed["params"], full["params"])
  jax.tree.map(np.testing.assert_array_equal, resumed["opt_state"], full["opt_state"])


@pytest.mark.slow
def test_sample_cli_draws_a_gan_in_one_call_and_refuses_sampler_options(gan_run, tmp_path,
                                                                          capsys):
  from jaxdl import cli
  _, workdir = gan_run
  out = tmp_path / "x.npy"
  assert cli.main(["sample", str(workdir), "--num", "8", "--out", str(out)]) == 0
  assert np.load(out).shape == (8, 2)
  for flag, value in (("--steps", "1"), ("--sampler", "euler"), ("--class", "3")):
    capsys.readouterr()
    assert cli.main(["sample", str(workdir), flag, value, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"jaxdl: error: {flag}: a 'gan' run samples with one network call")
    assert "\n" not in err
