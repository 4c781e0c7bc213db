"""Task losses against their formulas, written out here."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdl.train import make_task


def _config(smoothing: float) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({"task": "classification",
                                    "train": {"label_smoothing": smoothing}})


LOGITS_BxK = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0]], np.float32)
LABELS_B = np.array([0, 1], np.int32)


def _loss(smoothing: float, train: bool):
  task = make_task(_config(smoothing))
  apply_fn = lambda variables, x, train, **kw: x  # noqa: E731 -- the "model" returns its input
  loss, (metrics, _) = task.loss_fn(apply_fn, {}, {}, {"x": jnp.asarray(LOGITS_BxK),
                                                      "y": jnp.asarray(LABELS_B)},
                                    {"dropout": jax.random.PRNGKey(0)}, train)
  return float(loss), {k: float(v) for k, v in metrics.items()}


def _log_softmax(z):
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_training_minimizes_the_smoothed_cross_entropy():
  s, k = 0.2, 3
  q_BxK = (1 - s) * np.eye(k)[LABELS_B] + s / k
  expected = float(-(q_BxK * _log_softmax(LOGITS_BxK)).sum(-1).mean())
  loss, _ = _loss(s, train=True)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_evaluation_reports_the_plain_nll_under_label_smoothing():
  """Held-out loss is -mean log p(y|x), whatever smoothing training used."""
  nll = float(-_log_softmax(LOGITS_BxK)[np.arange(2), LABELS_B].mean())
  loss, metrics = _loss(0.2, train=False)
  np.testing.assert_allclose(loss, nll, rtol=1e-6)
  np.testing.assert_allclose(metrics["nll"], nll, rtol=1e-6)
  smoothed, _ = _loss(0.2, train=True)
  np.testing.assert_allclose(metrics["smoothed_loss"], smoothed, rtol=1e-6)
  assert abs(smoothed - nll) > 0.05  # the two differ here, so the check above can fail
  # Without smoothing the one loss is the NLL in both modes.
  assert math.isclose(_loss(0.0, train=True)[0], nll, rel_tol=1e-6)
