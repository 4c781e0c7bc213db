"""jaxdl.generative.losses: targets written out, the minimiser, masks, condition dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.generative import closed_forms, losses, paths

K_T, K_N = jax.random.PRNGKey(1), jax.random.PRNGKey(2)


def test_flow_matching_loss_is_the_velocity_mse_written_out():
  x = jax.random.normal(jax.random.PRNGKey(0), (64, 2))
  net = lambda x_t, t_B: (jnp.sin(x_t) * t_B[:, None], None)
  loss, per_B, _ = losses.flow_matching_loss(net, x, K_T, K_N)
  t = jax.random.uniform(K_T, (64,))
  eps = jax.random.normal(K_N, (64, 2))
  x_t = t[:, None] * x + (1 - t[:, None]) * eps
  expected_B = np.mean((np.sin(x_t) * t[:, None] - (x - eps)) ** 2, axis=1)
  np.testing.assert_allclose(per_B, expected_B, rtol=1e-5)
  np.testing.assert_allclose(loss, expected_B.mean(), rtol=1e-5)


@pytest.mark.parametrize("prediction", ["eps", "x0", "v"])
def test_ddpm_loss_targets(prediction):
  path = paths.make_path("ddpm", T=50)
  x = jax.random.normal(jax.random.PRNGKey(0), (32, 3))
  seen = {}

  def net(x_t, tm_B):
    seen["x_t"], seen["tm"] = x_t, tm_B
    return jnp.zeros_like(x_t), None

  _, per_B, _ = losses.ddpm_loss(net, x, K_T, K_N, path, prediction=prediction)
  t = np.asarray(jax.random.randint(K_T, (32,), 1, 51))
  assert t.min() >= 1 and t.max() <= 50
  a, s = np.sqrt(path.alpha_bar[t])[:, None], np.sqrt(1 - path.alpha_bar[t])[:, None]
  eps = np.asarray(jax.random.normal(K_N, (32, 3)))
  np.testing.assert_allclose(seen["x_t"], a * x + s * eps, atol=1e-5)
  np.testing.assert_allclose(seen["tm"], t / 50, rtol=1e-6)
  target = {"eps": eps, "x0": np.asarray(x), "v": a * eps - s * np.asarray(x)}[prediction]
  np.testing.assert_allclose(per_B, np.mean(target**2, axis=1), rtol=1e-4)


def test_the_exact_two_point_field_beats_perturbed_fields():
  """v*(y, t) = E[x - eps | x_t = y] minimises the velocity MSE (regression to the mean)."""
  x = jnp.sign(jax.random.normal(jax.random.PRNGKey(0), (20000, 1)))
  exact = lambda x_t, t: (  # noqa: E731
      closed_forms.two_point_posterior_velocity(x_t, jnp.minimum(t, 0.999)[:, None]), None)
  best = float(losses.flow_matching_loss(exact, x, K_T, K_N)[0])
  for delta in (0.1, -0.1):
    shifted = lambda x_t, t, d=delta: (exact(x_t, t)[0] + d, None)
    # E|v* + d - Y|^2 = E|v* - Y|^2 + d^2 up to sampling noise.
    np.testing.assert_allclose(float(losses.flow_matching_loss(shifted, x, K_T, K_N)[0]) - best,
                               delta**2, atol=5e-3)
  scaled = lambda x_t, t: (1.2 * exact(x_t, t)[0], None)
  assert float(losses.flow_matching_loss(scaled, x, K_T, K_N)[0]) > best


def test_mask_excludes_padded_examples():
  x = jax.random.normal(jax.random.PRNGKey(0), (16, 2))
  mask = jnp.array([1.0] * 10 + [0.0] * 6)
  net = lambda x_t, t_B: (x_t * 0.5, None)
  loss_a, per_B, _ = losses.flow_matching_loss(net, x, K_T, K_N, mask_B=mask)
  x_b = x.at[10:].set(100.0)  # garbage in the padded rows
  loss_b, _, _ = losses.flow_matching_loss(net, x_b, K_T, K_N, mask_B=mask)
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
  np.testing.assert_allclose(loss_a, per_B[:10].mean(), rtol=1e-6)


def test_drop_condition_rate_and_identity():
  y = jnp.zeros((20000,), jnp.int32) + 3
  dropped = losses.drop_condition(jax.random.PRNGKey(0), y, 0.1, null_class=10)
  frac = float(jnp.mean(dropped == 10))
  assert abs(frac - 0.1) < 0.01  # binomial sd 0.002
  assert set(np.unique(dropped).tolist()) == {3, 10}
  np.testing.assert_array_equal(losses.drop_condition(jax.random.PRNGKey(0), y, 0.0, 10), y)


def test_unknown_prediction_is_an_error():
  with pytest.raises(ValueError, match="prediction='score'"):
    losses.denoising_loss(lambda x, t: (x, None), jnp.zeros((2, 2)), K_T, K_N, paths.FlowPath(),
                          prediction="score")
