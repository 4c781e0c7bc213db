"""Tests for jaxdl.generative.vae: closed-form KL, a linear-Gaussian VAE's ELBO against its
exact log-likelihood, and the KL warmup's beta ramp."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models as jmodels
from jaxdl.generative import vae
from jaxdl.train import tasks

# p(z) = N(0, I_2), p(x|z) = N(W z + b, s^2 I_4): log p(x) = log N(x; b, W W^T + s^2 I). W has
# orthogonal columns, so the exact posterior N(M^-1 W^T (x - b), s^2 M^-1), M = W^T W + s^2 I,
# has a diagonal covariance: an encoder with a diagonal q can match it exactly.
D, Z, S = 4, 2, 0.5
_Q = np.linalg.qr(np.random.default_rng(0).standard_normal((D, D)))[0]
W_DxZ = (_Q[:, :Z] * np.array([2.0, 0.7])).astype(np.float32)
B_D = np.array([0.3, -0.5, 1.0, 0.2], np.float32)
M_ZxZ = W_DxZ.T @ W_DxZ + S**2 * np.eye(Z)
POST_VAR_Z = np.diag(S**2 * np.linalg.inv(M_ZxZ)).astype(np.float32)


def test_closed_form_kl_matches_a_monte_carlo_estimate():
  # Imported here: at collection both xdist workers would import it (0.9 CPU-s each).
  import scipy.stats  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  mu_BxZ = rng.standard_normal((3, 5)).astype(np.float32)
  logvar_BxZ = rng.uniform(-2, 1, (3, 5)).astype(np.float32)
  n = 50_000
  z_NxBxZ = mu_BxZ + np.exp(0.5 * logvar_BxZ) * rng.standard_normal((n, 3, 5))
  log_q = scipy.stats.norm.logpdf(z_NxBxZ, mu_BxZ, np.exp(0.5 * logvar_BxZ)).sum(-1)
  terms_NxB = log_q - scipy.stats.norm.logpdf(z_NxBxZ).sum(-1)  # log q(z) - log p(z), z ~ q
  se_B = terms_NxB.std(0) / np.sqrt(n)
  kl_B = np.asarray(vae.gaussian_kl(jnp.asarray(mu_BxZ), jnp.asarray(logvar_BxZ)))
  assert np.all(np.abs(terms_NxB.mean(0) - kl_B) < 4 * se_B), (terms_NxB.mean(0), kl_B, se_B)


def _linear_vae_params(model, enc_scale=1.0):
  """The exact posterior's encoder (enc_scale = 1) or a mis-scaled one, and the true decoder."""
  enc_A_DxZ = W_DxZ @ np.linalg.inv(M_ZxZ) * enc_scale
  kernel = np.concatenate([enc_A_DxZ, np.zeros((D, Z))], axis=1)
  bias = np.concatenate([-B_D @ enc_A_DxZ, np.log(POST_VAR_Z)])
  params = {"enc_out": {"kernel": kernel, "bias": bias},
            "dec_out": {"kernel": W_DxZ.T, "bias": B_D},
            "log_sigma": np.full((D,), np.log(S))}
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, D)), train=False)
  assert jax.tree.structure(shapes["params"]) == jax.tree.structure(params)
  return {"params": jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)}


@pytest.fixture(scope="module")
def linear_vae():
  # Imported here: at collection both xdist workers would import it (0.9 CPU-s each).
  import scipy.stats  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict(dict(
      task="vae", model=dict(name="vae", data_shape=(D,), latent=Z, hidden=(), decoder="gaussian"),
      gen=dict(beta=1.0, sample_shape=(D,))))
  model = jmodels.build_model(config.model)
  x_ND = B_D + np.random.default_rng(2).standard_normal((16, Z)) @ W_DxZ.T
  x_ND = (x_ND + S * np.random.default_rng(3).standard_normal((16, D))).astype(np.float32)
  cov = W_DxZ @ W_DxZ.T + S**2 * np.eye(D)
  logp_N = scipy.stats.multivariate_normal(B_D, cov).logpdf(x_ND)
  return config, model, x_ND, logp_N


def test_linear_gaussian_vae_elbo_is_log_p_at_the_exact_posterior_and_below_by_the_kl_gap(
    linear_vae):
  config, model, x_ND, logp_N = linear_vae
  loss_fn = tasks.make_task(config).loss_fn
  k = 2048  # z draws per example
  batch = {"x": jnp.asarray(np.repeat(x_ND, k, axis=0))}
  rngs = {"noise": jax.random.PRNGKey(4)}

  @jax.jit
  def elbo_and_identity(variables):
    _, (metrics, _) = loss_fn(model.apply, variables["params"], {}, batch, rngs, True)
    # log p(x|z) + log p(z) - log q(z|x) at one z per row: equal to log p(x) for every z when q is
    # the exact posterior (zero variance), which checks encoder, decoder and log p(x|z) pointwise.
    mu, logvar = model.apply(variables, batch["x"][:16], method=vae.VAE.encode)
    z = mu + jnp.exp(0.5 * logvar) * jax.random.normal(jax.random.PRNGKey(5), mu.shape)
    out = model.apply(variables, z, method=vae.VAE.decode)
    log_px = model.apply(variables, batch["x"][:16], out, method=vae.VAE.log_px)
    log_pz = jax.scipy.stats.norm.logpdf(z).sum(1)
    log_qz = jax.scipy.stats.norm.logpdf(z, mu, jnp.exp(0.5 * logvar)).sum(1)
    return metrics, log_px + log_pz - log_qz

  exact = _linear_vae_params(model)
  metrics, identity_16 = elbo_and_identity(exact)
  np.testing.assert_allclose(identity_16, np.repeat(logp_N, k)[:16], atol=1e-4)
  # The ELBO is an average of log p(x|z) - KL over 16 x 2048 draws: Monte-Carlo error ~0.01 nats.
  np.testing.assert_allclose(float(metrics["elbo"]), logp_N.mean(), atol=0.05)
  np.testing.assert_allclose(float(metrics["bpd"]), -logp_N.mean() / (D * np.log(2)), atol=0.02)
  assert float(metrics["active_units"]) == Z
  # A mis-scaled encoder: the bound drops by KL(q || p(z|x)) (closed form between diagonal
  # Gaussians with equal variances: |mean difference|^2 / (2 var), summed over the latent dims).
  worse, _ = elbo_and_identity(_linear_vae_params(model, enc_scale=0.6))
  post_mean_NxZ = (x_ND - B_D) @ W_DxZ @ np.linalg.inv(M_ZxZ)
  gap = np.mean(np.sum((0.4 * post_mean_NxZ) ** 2 / (2 * POST_VAR_Z), axis=1))
  assert gap > 0.3  # a gap well above the Monte-Carlo error
  np.testing.assert_allclose(logp_N.mean() - float(worse["elbo"]), gap, atol=0.05)


def test_the_bound_does_not_depend_on_the_batch_size(linear_vae):
  """One noise draw per example for all of x first: batches of 1, 7 and all give one number."""
  _, model, x_ND, logp_N = linear_vae
  exact = _linear_vae_params(model)
  bounds = [vae.run_elbo(model, exact, x_ND, batch_size=b) for b in (1, 7, None)]
  for b in bounds[1:]:
    np.testing.assert_allclose([b["elbo"], b["bpd"]], [bounds[0]["elbo"], bounds[0]["bpd"]],
                               rtol=1e-6)
  # One z per example of 16: a bound within the Monte-Carlo error of log p(x) - 0 (exact q).
  np.testing.assert_allclose(bounds[0]["elbo"], logp_N.mean(), atol=1.0)
  # Copies of one example get their own draws: the bound of 64 copies differs from one copy's.
  copies = np.repeat(x_ND[:1], 64, axis=0)
  assert vae.run_elbo(model, exact, copies)["elbo"] != vae.run_elbo(model, exact, x_ND[:1])["elbo"]


def test_kl_warmup_ramps_beta_linearly_over_the_counted_updates(linear_vae):
  config, model, x_ND, _ = linear_vae
  config = ml_collections.ConfigDict(config.to_dict())
  config.gen.beta, config.gen.kl_warmup = 2.0, 4
  loss_fn = tasks.make_task(config).loss_fn
  params = _linear_vae_params(model)["params"]
  batch, rngs = {"x": jnp.asarray(x_ND)}, {"noise": jax.random.PRNGKey(6)}

  @jax.jit
  def at(updates):
    state = {"progress": {"updates": updates}}
    return (loss_fn(model.apply, params, state, batch, rngs, True),
            loss_fn(model.apply, params, state, batch, {}, False))

  for u, beta_u in ((0, 0.0), (1, 0.5), (3, 1.5), (4, 2.0), (9, 2.0)):
    (loss, (m, state)), (_, (m_eval, state_eval)) = at(jnp.int32(u))
    np.testing.assert_allclose(float(m["beta"]), beta_u)
    np.testing.assert_allclose(float(loss) * D, float(m["rec"] + beta_u * m["kl"]), rtol=1e-5)
    assert int(state["progress"]["updates"]) == u + 1  # training counts the update ...
    assert int(state_eval["progress"]["updates"]) == u and float(m_eval["beta"]) == 2.0  # eval not
  with pytest.raises(ValueError, match="gen.kl_warmup: the model state has no 'progress'"):
    loss_fn(model.apply, params, {}, batch, rngs, True)


def test_bad_vae_settings_are_one_line_errors_naming_the_key(linear_vae):
  config, *_ = linear_vae
  for key, value, match in (("gen.beta", -1.0, "gen.beta: must be"),
                            ("gen.kl_warmup", -5, "gen.kl_warmup: must be >= 0, got -5$"),
                            ("gen.sample_shape", (8, 8, 1), "model.data_shape"),
                            ("gen.guidance", 2.0, "gen.guidance: unknown key")):
    bad = ml_collections.ConfigDict(config.to_dict())
    section, leaf = key.split(".")
    bad[section][leaf] = value
    with pytest.raises(ValueError, match=match) as e:
      tasks.make_task(bad)
    assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="model.decoder: expected one of"):
    jmodels.build_model(ml_collections.ConfigDict(dict(name="vae", decoder="laplace")))


@pytest.mark.slow
def test_vae_digits_smoke_trains_on_the_engine_and_samples_in_one_call(tmp_path, capsys):
  from jaxdl import cli
  from jaxdl.config import load_config
  from jaxdl.train import run
  config, _ = load_config("vae_digits:smoke", ["train.plot=False", "train.steps=4",
                                               "train.eval_every=4", "train.ckpt_every=4"])
  summary = run(config, tmp_path, progress=False)
  ev = summary["eval"]
  assert summary["step"] == 4 and ev["elbo"] < 0 and ev["kl"] > 0
  np.testing.assert_allclose(ev["elbo"], -(ev["rec"] + ev["kl"]), rtol=1e-5)
  np.testing.assert_allclose(ev["bpd"], -ev["elbo"] / (64 * np.log(2)), rtol=1e-5)
  assert 0 <= ev["active_units"] <= config.model.latent
  out = tmp_path / "x.npy"
  assert cli.main(["sample", str(tmp_path), "--num", "8", "--out", str(out)]) == 0
  assert np.load(out).shape == (8, 8, 8, 1)
  capsys.readouterr()
  assert cli.main(["sample", str(tmp_path), "--guidance", "2", "--out", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("jaxdl: error: --guidance") and "\n" not in err
  # `jaxdl likelihood` reports the bound on the whole eval split as the run's own evaluation did
  # (one batch of 360, the same fixed z draw), and the same in chunks of 7 or 1 (one z per
  # example, drawn for all of them first).
  for batch in ("512", "7", "1"):
    assert cli.main(["likelihood", str(tmp_path), "--num", "1000", "--batch-size", batch]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["kind"].startswith("bound") and whole["num"] == 360
    np.testing.assert_allclose([whole["nats"], whole["bits_per_dim"]], [ev["elbo"], ev["bpd"]],
                               rtol=1e-5)
  assert cli.main(["likelihood", str(tmp_path), "--steps", "10"]) == 2  # no ODE to step
  err = capsys.readouterr().err.strip()
  assert err.startswith("jaxdl: error: --steps: a 'vae' run's likelihood is its ELBO bound")
