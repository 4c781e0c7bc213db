"""The training doctor: planted bugs are caught and named, healthy runs pass, diagnoses, LR range.

Preflights run with small budgets (5 real steps, 100 overfit steps, 60 learnability steps) to keep
this file fast; the numbers in the comments were measured with the CLI defaults (20 / 200 / 100).
"""

import json
import math

import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.course import planted
from jaxdl.doctor import diagnose_history, lr_range_test, run_preflight
from jaxdl.doctor.context import prepare
from jaxdl.doctor.preflight import check_first_loss
from jaxdl.doctor.report import Finding, Report

BUDGET = dict(steps=5, overfit_steps=100, learn_steps=60)


def _preflight(name: str) -> Report:
  config, _ = load_config(name)
  return run_preflight(config, **BUDGET)


# --- planted bugs: the right check fails and names the right cause -----------------------------

def test_last_layer_x100_first_loss_far_from_ln_k(capsys):
  # Through the CLI, as a user would run it: exit 1 and a JSON report.
  code = cli.main(["doctor", "bug_last_layer_x100", "--json", "--steps", "5",
                   "--overfit-steps", "100", "--learn-steps", "60"])
  report = json.loads(capsys.readouterr().out)
  assert code == 1 and not report["ok"]
  first = next(c for c in report["checks"] if c["name"] == "first_loss")
  assert first["status"] == "fail" and first["cause"] == "last_layer_too_large"
  # Logits ~ 100 x a ~0.27-std fresh head: the loss is about 55, far from ln 10 = 2.303.
  assert first["values"]["ln_k"] == pytest.approx(math.log(10), abs=1e-6)
  assert 30.0 < first["values"]["loss"] < 80.0
  assert first["values"]["logit_std"] > 10.0
  assert report["causes"][0] == "last_layer_too_large"


def test_shuffled_labels_nothing_carries_over():
  report = _preflight("bug_shuffled_labels")
  assert report["first_loss"].status == "pass"        # the first loss cannot see it
  assert report["overfit"].status == "pass"           # one batch can still be memorized
  learn = report["learnable"]
  assert learn.status == "fail" and learn.cause == "labels_misaligned"
  assert learn.values["heldout_after"] > 0.9 * math.log(10)
  assert report.causes() == ["labels_misaligned"]


def test_lr_too_high_goes_non_finite():
  report = _preflight("bug_lr_too_high")
  steps = report["first_steps"]
  assert steps.status == "fail" and steps.cause == "lr_too_high"
  assert steps.symptom == "nonfinite"
  losses = steps.values["losses"]
  assert not math.isfinite(losses[-1]) and losses[1] > 100 * losses[0]   # 2.3 -> 4e6 -> NaN
  assert report.causes()[0] == "lr_too_high"


def test_zero_init_units_stay_identical():
  report = _preflight("bug_zero_init")
  assert report["first_loss"].values["loss"] == pytest.approx(math.log(10), abs=1e-5)
  sym = report["symmetry"]
  assert sym.status == "fail" and sym.cause == "symmetric_init"
  assert set(sym.values["identical"]) == {"dense_0/kernel", "dense_1/kernel", "head/kernel"}
  assert report["overfit"].status == "fail"
  assert report.causes()[0] == "symmetric_init"


def test_eval_in_train_mode_depends_on_the_batch():
  report = _preflight("bug_eval_in_train_mode")
  ev = report["eval_mode"]
  assert ev.status == "fail" and ev.cause == "eval_mode_forgotten"
  assert ev.values["diff"] > 0.1
  assert report.causes() == ["eval_mode_forgotten"]


# --- healthy experiments pass; bad input -------------------------------------------------------

def test_healthy_moons_mlp_passes_preflight():
  report = _preflight("moons_mlp")
  assert report.ok, report.text()
  first = report["first_loss"]
  assert abs(first.values["loss"] - math.log(2)) < 0.1          # binary head: ln 2
  assert report["recompilation"].values["traces"] == 1
  assert report["eval_mode"].values["diff"] == 0.0


def test_first_loss_skipped_without_a_classification_head():
  config = planted.digits_experiment("regression_head", "", task="regression", out=1)
  check = check_first_loss(prepare(config, steps=1))
  assert check.status == "skip"
  assert "regression" in check.summary and "no classification or language-model head" in \
      check.summary


def test_cli_bad_input(capsys):
  assert cli.main(["doctor", "no_such_experiment"]) == 2
  assert "not found" in capsys.readouterr().err
  assert cli.main(["doctor", "adamw_vs_l2"]) == 2      # a custom-run experiment, no model
  assert "not a standard training run" in capsys.readouterr().err


def test_report_counts_and_rejects_bad_status():
  r = Report("x", [Finding("a", "pass", ""), Finding("b", "warn", "", cause="c1"),
                   Finding("c", "fail", "", cause="c2"), Finding("d", "fail", "", cause="c2")])
  assert not r.ok and [c.name for c in r.failed()] == ["c", "d"]
  assert r.causes() == ["c2", "c1"]                    # failures first, no repeats
  with pytest.raises(ValueError, match="check status"):
    Finding("e", "bad", "")


# --- diagnoses from a metrics history ------------------------------------------------------------

def _train(losses, acc=None, start=1):
  return [{"step": start + i, "split": "train", "loss": float(l),
           **({"accuracy": acc[i]} if acc is not None else {})} for i, l in enumerate(losses)]


def _symptoms(*args, **kwargs):
  return [d.symptom for d in diagnose_history(*args, **kwargs)]


def test_history_healthy_has_no_symptom():
  losses = 2.3 * np.exp(-np.arange(100) / 30) + 0.1
  evals = [{"step": s, "split": "eval", "loss": float(losses[s - 1] * 1.05)} for s in (50, 100)]
  assert _symptoms(_train(losses), evals, ln_k=math.log(10)) == []


def test_history_first_loss_flat_spike_nonfinite():
  assert "first_loss" in _symptoms(_train([46.0, 20.0, 5.0, 2.0]), ln_k=math.log(10))
  assert "flat" in _symptoms(_train([2.30] * 40), ln_k=math.log(10))
  losses = list(2.3 * np.exp(-np.arange(60) / 20) + 0.2)
  losses[40] = 10 * losses[39]                           # one step at 10 x its neighbours
  spike = [d for d in diagnose_history(_train(losses)) if d.symptom == "spike"]
  assert spike and spike[0].step == 41
  nan = _train([2.3, 2.0, float("nan")])
  assert _symptoms(nan)[0] == "nonfinite"


def test_history_overfitting_val_below_train_and_eval_mode():
  steps = [25, 50, 75, 100]
  train = _train(np.linspace(2.0, 0.1, 100), acc=list(np.linspace(0.5, 1.0, 100)))
  rising = [{"step": s, "split": "eval", "loss": v} for s, v in zip(steps, [1.5, 0.9, 1.1, 1.4])]
  assert _symptoms(train, rising) == ["overfitting"]
  below = [{"step": s, "split": "eval", "loss": 0.5 * train[s - 1]["loss"]} for s in steps]
  assert _symptoms(train, below) == ["val_below_train"]
  bad_eval = [{"step": s, "split": "eval", "loss": 3 * train[s - 1]["loss"] + 0.5,
               "accuracy": train[s - 1]["accuracy"] - 0.3} for s in steps]
  assert _symptoms(train, bad_eval) == ["eval_mode"]


# --- LR range test ------------------------------------------------------------------------------

def test_lr_range_gives_a_plot_and_a_suggestion(tmp_path):
  config, _ = load_config("moons_mlp")
  n, lo, hi = 40, 1e-5, 10.0
  r = lr_range_test(config, steps=n, lr_min=lo, lr_max=hi, plot_path=str(tmp_path / "lr.png"))
  t = np.arange(len(r.lrs))
  np.testing.assert_allclose(r.lrs, lo * (hi / lo) ** (t / (n - 1)), rtol=1e-5)
  # Suggested = a tenth of the lr at the minimum of the bias-corrected EMA (beta 0.9) loss.
  finite = np.isfinite(r.losses)
  ema, avg = [], 0.0
  for i, x in enumerate(r.losses[finite]):
    avg = 0.9 * avg + 0.1 * x
    ema.append(avg / (1 - 0.9 ** (i + 1)))
  assert r.suggested == pytest.approx(r.lrs[finite][int(np.argmin(ema))] / 10, rel=1e-6)
  assert min(ema) < 0.8 * ema[0]                         # the sweep found a falling stretch
  assert lo < r.suggested < hi
  assert (tmp_path / "lr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert r.check().status in ("pass", "warn")


def _first_losses(spec: str, grad_accum: int) -> np.ndarray:
  from jaxdl.doctor.fitting import check_first_steps
  config, _ = load_config(spec, [f"train.grad_accum={grad_accum}"])
  return np.array(check_first_steps(prepare(config, steps=3))[0].values["losses"])


def test_first_steps_split_the_batch_as_the_experiment_does():
  """The doctor's real steps use train.grad_accum (a batch that fits in memory only as
  microbatches fits in the doctor too). Without BatchNorm or dropout the mean of 2 microbatch
  gradients is the full-batch gradient, so the losses agree; with BatchNorm each microbatch is
  normalized by its own statistics, so they differ, which shows the split happened."""
  np.testing.assert_allclose(_first_losses("moons_mlp", 2), _first_losses("moons_mlp", 1),
                             rtol=1e-5)
  split, whole = _first_losses("moons_mlp:bn", 2), _first_losses("moons_mlp:bn", 1)
  assert np.max(np.abs(split - whole)) > 1e-4, (split, whole)


def test_lr_range_splits_the_batch_as_the_experiment_does():
  """As the first steps: equal losses without BatchNorm, different with it."""
  def losses(spec, grad_accum):
    config, _ = load_config(spec, [f"train.grad_accum={grad_accum}"])
    return lr_range_test(config, steps=4, lr_min=1e-4, lr_max=1e-2).losses

  np.testing.assert_allclose(losses("moons_mlp", 2), losses("moons_mlp", 1), rtol=1e-5)
  assert np.max(np.abs(losses("moons_mlp:bn", 2) - losses("moons_mlp:bn", 1))) > 1e-4
