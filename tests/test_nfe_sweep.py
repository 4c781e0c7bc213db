"""jaxdl.generative.nfe_sweep and jaxdl.course.sampler_table: quality against network calls.

The network calls are counted twice, by the rule (`samplers.network_calls`) and by a denoiser that
counts its own calls (a host callback in the compiled scan); the sweep runs on an untrained
edm_digits:smoke checkpoint with a stand-in judge (the procedure, not the numbers)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.course import sampler_table
from jaxdl.generative import nfe_sweep, paths, samplers
from jaxdl.models import build_model

PATHS = {"flow": (paths.FlowPath(), "velocity"),
         "ddpm": (paths.make_path("ddpm", T=100, schedule="cosine"), "eps"),
         "edm": (paths.EDMPath(), "edm")}
# (path, sampler, N steps, network calls): the one-call rules N, heun 2N, edm_heun 2N - 1 (2N - 2
# on the flow and on DDPM from t = T, whose first step from pure noise is Euler too: 2 steps on
# the flow are 2 calls).
CALLS = [("flow", "euler", 5, 5), ("flow", "heun", 3, 6), ("flow", "edm_heun", 5, 8),
         ("flow", "edm_heun", 2, 2), ("ddpm", "ddpm", 3, 3), ("ddpm", "edm_heun", 4, 6),
         ("ddpm", "dpmpp_3m", 4, 4), ("edm", "edm_heun", 5, 9), ("edm", "dpmpp_2m", 4, 4)]


def _counting_denoiser(count):
  def apply(variables, x, t_1, y=None, train=False):
    del variables, t_1, y, train
    jax.debug.callback(lambda: count.__setitem__(0, count[0] + 1))
    return -0.5 * x
  return apply


@pytest.mark.parametrize("path_name,sampler,steps,expected", CALLS)
def test_network_calls_are_what_the_compiled_sampler_calls(path_name, sampler, steps, expected):
  path, prediction = PATHS[path_name]
  assert samplers.network_calls(path, sampler=sampler, steps=steps) == expected
  count = [0]
  sample = samplers.make_sampler(_counting_denoiser(count), path, sampler=sampler, steps=steps,
                                 sample_shape=(1,), prediction=prediction)
  assert sample.calls == expected
  jax.block_until_ready(sample(None, jax.random.PRNGKey(0), 3))
  jax.effects_barrier()
  assert count[0] == expected


def test_steps_for_calls_matches_euler_at_equal_calls():
  flow = paths.FlowPath()
  assert nfe_sweep.steps_for_calls(flow, "euler", 20) == 20
  assert nfe_sweep.steps_for_calls(flow, "heun", 20) == 10
  assert nfe_sweep.steps_for_calls(flow, "edm_heun", 20) == 11   # 2 x 11 - 2
  assert nfe_sweep.steps_for_calls(flow, "dpmpp_3m", 2) == 3     # its order
  with pytest.raises(ValueError, match="sampler: expected one of .*, got 'unipc'"):
    samplers.network_calls(flow, sampler="unipc", steps=4)


def test_plan_skips_what_the_path_refuses_with_make_samplers_reason():
  config, _ = load_config("ddpm_digits_cfg:smoke")
  cells, skipped = nfe_sweep.plan(config, build_model(config.model),
                                  ["ddim", "euler", "heun", "dpmpp_3m"], [2, 4])
  assert [(name, n) for name, n, _ in cells] == [("ddim", 2), ("ddim", 4), ("dpmpp_3m", 4)]
  by = {(s["sampler"], s["steps"]): s["reason"] for s in skipped}
  assert set(by) == {("euler", None), ("heun", None), ("dpmpp_3m", 2)}
  assert "needs the 'flow' path" in by[("euler", None)]
  assert by[("dpmpp_3m", 2)] == "N = 2 is below the order 3 of 'dpmpp_3m'"
  with pytest.raises(ValueError, match=r"--samplers: unknown \['eulr'\]"):
    nfe_sweep.plan(config, None, ["eulr"], [2])
  with pytest.raises(ValueError, match="--steps: expected step counts >= 1"):
    nfe_sweep.plan(config, None, ["ddim"], [0, 4])


def stand_in_judge(pix_Nx64):
  """A fixed random linear 'classifier' on the pixels: (probs_Nx10, features_Nx8)."""
  w = np.random.default_rng(0).normal(size=(64, 18)) / 16
  z = np.asarray(pix_Nx64, np.float64) @ w
  logits = 4 * z[:, :10]
  probs = np.exp(logits - logits.max(1, keepdims=True))
  return probs / probs.sum(1, keepdims=True), z[:, 10:]


@pytest.fixture(scope="module")
def edm_run(tmp_path_factory, untrained_run):
  """An untrained edm_digits:smoke checkpoint (the sweep's procedure needs no training)."""
  return untrained_run(tmp_path_factory.mktemp("nfe") / "edm", "edm_digits:smoke",
                       jnp.zeros((1, 8, 8, 1)), jnp.zeros((1,)))


def test_sweep_writes_the_table_and_figure_with_honest_nfe(edm_run, tmp_path):
  lines = []
  table = sampler_table.sampler_table(edm_run, [2, 3], samplers=("heun", "edm_heun", "dpmpp_3m"),
                                      judge=stand_in_judge, per_class=3, out_dir=tmp_path,
                                      log=lines.append)
  assert (table["task"], table["path"], table["guidance"]) == ("edm", "edm", 1.5)  # its config's
  assert table["nfe_per_call"] == 2 and table["num"] == 30 and table["judge"] == "stand_in_judge"
  got = [(r["sampler"], r["steps"], r["calls"], r["nfe"]) for r in table["rows"]]
  # edm_heun: 2N - 1 calls (last step Euler); guided, each call evaluates 2 inputs per sample.
  assert got == [("edm_heun", 2, 3, 6), ("edm_heun", 3, 5, 10), ("dpmpp_3m", 3, 3, 6)]
  for r in table["rows"]:
    assert np.isfinite(r["frechet"]) and 0 <= r["confident"] <= 1
  assert table["skipped"] == [
      dict(sampler="heun", steps=None, reason="sampler='heun' cannot run on the 'edm' path: it "
           "calls the network at sigma = 0, where c_noise = ln(0)/4; use 'edm_heun' (its last "
           "step is Euler)"),
      dict(sampler="dpmpp_3m", steps=2, reason="N = 2 is below the order 3 of 'dpmpp_3m'")]
  assert lines[0].startswith("skip heun: sampler='heun' cannot run")
  assert json.loads((tmp_path / "nfe_sweep.json").read_text()) == table
  assert (tmp_path / "nfe_sweep.png").stat().st_size > 0
  md = nfe_sweep.markdown(table)
  assert "| edm_heun |" in md and "@ 10" in md and "skipped heun:" in md


def test_sampler_table_refuses_a_missing_run_or_judge_in_one_line(tmp_path):
  config, _ = load_config("fm_toy2d:smoke")
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  with pytest.raises(ValueError, match="no classification run there"):
    sampler_table.sampler_table(tmp_path, [2], judge=str(tmp_path / "nothing"))
  with pytest.raises(ValueError, match="no trained run here"):
    sampler_table.sampler_table(tmp_path / "missing", [2])


def test_nfe_cli_refuses_bad_steps_and_out_in_one_line(tmp_path, capsys):
  for argv, message in ((["--steps", "4,x"], "--steps 4,x: expected integers"),
                        (["--steps", "4", "--out", str(tmp_path / "no")], "--out"),
                        (["--steps", "4"], "no trained run here")):
    assert cli.main(["nfe", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
  assert list(tmp_path.iterdir()) == []
