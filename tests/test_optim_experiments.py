"""The optimizer experiments: they show their claim's numbers, and they write their artifacts.

The course's numbers are the claims adamw_vs_l2, sgd_vs_momentum and schedules of
`jaxdl reproduce`; here each claim is run once, its rows checked (tests/test_reproduce.py leaves
these three to this module), and the experiment's `run` checked against the claim's measurement,
through the experiment's own code path and files.
"""

import ast
import json
import pathlib

import numpy as np
import pytest

from jaxdl.config import load_config
from jaxdl.course import reproduce

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


def _measured(claim: str) -> dict:
  """The claim's measured values, once its rows hold: tests/test_reproduce.py leaves these
  three claims to this module (each was computed in both; adamw_vs_l2 took 6.4 CPU-s there)."""
  rows = reproduce.run_claims([claim], configs={claim: load_config(claim)[0]})
  assert rows and {r.name.split(".")[0] for r in rows} == {claim}, claim
  for r in rows:
    assert r.ok, f"{r.name}: expected {r.expected}, measured {r.measured} ({r.tolerance})"
  return {r.name.split(".", 1)[1]: r.measured for r in rows}


def test_sgd_vs_momentum_shows_its_claim(tmp_path):
  out, workdir = _run("sgd_vs_momentum", tmp_path)
  claim = _measured("sgd_vs_momentum")
  for rule in ("sgd", "momentum"):
    np.testing.assert_allclose([out[rule]["theta1"], out[rule]["theta2"]], claim[f"{rule}_final"],
                               rtol=1e-6)
  traj = json.loads((workdir / "results.json").read_text())
  sgd, mom = np.array(traj["sgd"]["trajectory"]), np.array(traj["momentum"]["trajectory"])
  assert sgd.shape == (17, 2)
  np.testing.assert_allclose([sgd[1], sgd[4], mom[5]], claim["figure_points"], rtol=1e-6)
  # closed form for SGD on a diagonal quadratic: theta_i (1 - 2 a_i eta)^t
  np.testing.assert_allclose(sgd[16], [-8.5 * (1 - 0.085)**16, 1.8 * (1 - 1.7)**16], rtol=1e-4)
  assert (workdir / "trajectories.png").stat().st_size > 1000


@pytest.mark.compute_bound  # 10.8-12.2 CPU-s fast-compiled, 7.8 not
def test_adamw_vs_l2_shows_its_claim(tmp_path):
  out, workdir = _run("adamw_vs_l2", tmp_path)
  claim = _measured("adamw_vs_l2")
  for rule in ("adam_l2", "adamw"):
    np.testing.assert_allclose([out[rule]["noisy"], out[rule]["quiet"]], claim[f"{rule}_means"],
                               rtol=1e-6)
  # Decoupled decay: every AdamW weight ends at the zero-gradient factor the claim measures.
  assert out["adamw"]["quiet"] == pytest.approx(claim["decay_closed_form"], abs=TOL)
  assert json.loads((workdir / "results.json").read_text())["adamw"] == out["adamw"]
  assert (workdir / "group_means.png").stat().st_size > 1000


def test_schedules_and_extension(tmp_path):
  out, workdir = _run("schedules", tmp_path)
  claim = _measured("schedules")
  lr = json.loads((workdir / "results.json").read_text())["lr"]
  T = load_config("schedules")[0].total_steps
  # The experiment's curves are the claim's at 0, 10% and 50% of T.
  for k in ("step", "cosine", "warmup_cosine"):
    np.testing.assert_allclose([lr[k][str(t)] for t in (0, T // 10, T // 2)],
                               claim[f"{k}_at_0_10_50_100pct"][:3], rtol=1e-6)
  # measured: [extension_check, largest change of an lr already taken]
  assert [out["wsd_extension_ok"], out["wsd_max_abs_diff_taken"]] == claim[
      "wsd_extended_50pct_keeps_lrs"]
  assert out["cosine_extension_ok"] == claim["cosine_extended_50pct_keeps_lrs"][0]
  assert out["cosine_max_abs_diff_taken"] > TOL
  assert (workdir / "schedules.png").stat().st_size > 1000


# sgd_vs_momentum's smoke config is its full config; schedules' only shrinks T.
@pytest.mark.parametrize("name", ["adamw_vs_l2"])
def test_smoke_configs_run(name, tmp_path):
  out, workdir = _run(name, tmp_path, "smoke")
  assert out and (workdir / "results.json").exists()
  assert any(p.suffix == ".png" for p in workdir.iterdir())
