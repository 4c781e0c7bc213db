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


def test_task_kinds_answer_what_callers_ask():
  """The registry's typed kinds: the attributes the engine, doctor and samplers read."""
  import jaxdl.generative  # noqa: F401  registers the generative tasks
  from jaxdl.train.tasks import Family, kind_of
  lm, cls, ddpm, vae, gan = (kind_of(n) for n in ("lm", "classification", "ddpm", "vae", "gan"))
  assert lm.sequence_model and not cls.sequence_model and lm.supervised
  assert cls.labels and kind_of("node_classification").labels and not lm.labels
  assert ddpm.is_generative and not ddpm.one_call and ddpm.likelihood == "ode"
  assert vae.one_call and vae.likelihood == "elbo" and gan.one_call and gan.likelihood is None
  assert kind_of("edm").path == "edm" and kind_of("flow_matching").path == "flow"
  assert lm.head_classes({"vocab_size": 7}) == 7 and kind_of("binary").head_classes({}) == 2
  assert kind_of("regression").head_classes({"num_classes": 3}) is None
  task = make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  assert task.kind is lm and task.kind.family is Family.LM


def test_the_old_masked_lm_task_is_refused_naming_its_replacement():
  import pytest
  from jaxdl.schema import ConfigError
  with pytest.raises(ConfigError, match="'lm_masked' is now 'lm'") as e:
    make_task(ml_collections.ConfigDict({"task": "lm_masked", "train": {}}))
  assert "\n" not in str(e.value)


def test_no_code_compares_task_names():
  """Task kinds are asked as `TaskKind` attributes; a comparison of `task` (or a task's `kind`)
  with a string literal, a tuple of them or a *_TASKS constant is the pattern this replaced."""
  import pathlib
  import re
  pattern = re.compile(r"""\btask(\.kind)?\s*(==|!=|\bin\b|\bnot in\b)\s*"""
                       r"""([("'\[]|[A-Z_]*TASKS\b)""")
  root = pathlib.Path(__file__).resolve().parents[1] / "jaxdl"
  found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if pattern.search(line)]
  assert not found, found
