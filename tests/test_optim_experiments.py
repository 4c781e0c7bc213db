"""The optimizer experiments: their numbers against the issue's values, their artifacts."""

import ast
import json
import pathlib

import numpy as np
import pytest

from jaxdl.config import load_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = ("adamw_vs_l2", "sgd_vs_momentum", "schedules")
TOL = 0.01


def _run(name, tmp_path, arg=None):
  spec = str(ROOT / "experiments" / f"{name}.py") + (f":{arg}" if arg else "")
  config, module = load_config(spec)
  workdir = tmp_path / name
  workdir.mkdir()
  return module.run(config, str(workdir)), workdir


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_docstring_names_the_command_and_the_expectation(name):
  doc = ast.get_docstring(ast.parse((ROOT / "experiments" / f"{name}.py").read_text()))
  first, *rest = doc.splitlines()
  assert first and not first.endswith(":")
  assert f"jaxdl train experiments/{name}.py" in doc and "Expected" in doc


def test_sgd_vs_momentum_matches_the_course(tmp_path):
  out, workdir = _run("sgd_vs_momentum", tmp_path)
  assert out["sgd"]["theta1"] == pytest.approx(-2.052, abs=TOL)
  assert out["sgd"]["theta2"] == pytest.approx(0.006, abs=TOL)
  assert out["momentum"]["theta1"] == pytest.approx(-0.832, abs=TOL)
  assert out["momentum"]["theta2"] == pytest.approx(-0.697, abs=TOL)
  traj = json.loads((workdir / "results.json").read_text())
  sgd, mom = np.array(traj["sgd"]["trajectory"]), np.array(traj["momentum"]["trajectory"])
  assert sgd.shape == (17, 2)
  # intermediate points of the course's figure
  np.testing.assert_allclose(sgd[1], [-7.777, -1.260], atol=2e-3)
  np.testing.assert_allclose(sgd[4], [-5.958, 0.432], atol=2e-3)
  np.testing.assert_allclose(mom[5], [-6.987, -1.371], atol=2e-3)
  # closed form for SGD on a diagonal quadratic: theta_i (1 - 2 a_i eta)^t
  np.testing.assert_allclose(sgd[16], [-8.5 * (1 - 0.085)**16, 1.8 * (1 - 1.7)**16], rtol=1e-4)
  assert (workdir / "trajectories.png").stat().st_size > 1000


def test_adamw_vs_l2_group_means(tmp_path):
  out, workdir = _run("adamw_vs_l2", tmp_path)
  assert out["adam_l2"]["noisy"] == pytest.approx(0.99, abs=TOL)
  assert out["adam_l2"]["quiet"] == pytest.approx(0.262, abs=TOL)
  assert out["adamw"]["noisy"] == pytest.approx(0.904, abs=TOL)
  assert out["adamw"]["quiet"] == pytest.approx(0.904, abs=TOL)
  assert out["closed_form_decoupled"] == pytest.approx((1 - 1e-4)**1000)
  assert out["adamw"]["quiet"] == pytest.approx(out["closed_form_decoupled"], abs=TOL)
  assert json.loads((workdir / "results.json").read_text())["adamw"] == out["adamw"]
  assert (workdir / "group_means.png").stat().st_size > 1000


def test_schedules_and_extension(tmp_path):
  out, workdir = _run("schedules", tmp_path)
  assert out["step_lr_end"] == pytest.approx(0.1 * 0.5**3)
  assert out["cosine_lr_mid"] == pytest.approx(0.05, abs=1e-6)
  assert out["warmup_cosine_lr_peak"] == pytest.approx(0.1)
  assert out["wsd_extension_ok"] and out["wsd_max_abs_diff_taken"] == 0.0
  assert not out["cosine_extension_ok"] and out["cosine_max_abs_diff_taken"] > TOL
  assert (workdir / "schedules.png").stat().st_size > 1000


# sgd_vs_momentum's smoke config is its full config; schedules' only shrinks T.
@pytest.mark.parametrize("name", ["adamw_vs_l2"])
def test_smoke_configs_run(name, tmp_path):
  out, workdir = _run(name, tmp_path, "smoke")
  assert out and (workdir / "results.json").exists()
  assert any(p.suffix == ".png" for p in workdir.iterdir())
