"""Throughput, MFU, profiler traces and watched health signals of a run, through
`jaxdl.train.run` and the CLI (the watch maths on their own are in test_watch.py)."""

import json
import pathlib
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import ConfigError, load_config
from jaxdl.optim import find_ema
from jaxdl.train import TASKS, build, run, throughput
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics

PEAK = 1e12   # given, so the test never times a matmul
GPT = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "data.batch_size=8",
       "data.context_length=16", "model.block_size=16", "data.max_eval_windows=8",
       "train.steps=6", "train.log_every=2", "train.eval_every=0", "train.ckpt_every=0",
       "train.plot=False", f"train.peak_flops={PEAK}", "train.profile_steps=(3, 4)",
       "train.watch='detailed'", "train.watch_every=2"]


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("gpt")
  config, _ = load_config("char_gpt", GPT)
  summary = run(config, workdir, progress=False)
  return config, workdir, summary


def test_rates_and_mfu_follow_from_the_step_rate(gpt_run):
  config, workdir, _ = gpt_run
  rates = read_metrics(workdir, "throughput")
  # Step 1 is logged but has no previous read-back to measure from (and holds the compile).
  assert [r["step"] for r in rates] == [2, 4, 6]
  params = build(config).abstract_state().params
  n = sum(p.size for p in jax.tree.leaves(params)) - 16 * 32   # minus wpe
  flops_step = 8 * 16 * (6 * n + 12 * 2 * 32 * 16)                   # B T (6N + 12LDT)
  devices = jax.device_count()
  for rec in rates:
    s = rec["steps_per_s"]
    assert s > 0
    np.testing.assert_allclose(rec["examples_per_s"], 8 * s, rtol=1e-12)
    np.testing.assert_allclose(rec["tokens_per_s"], 8 * 16 * s, rtol=1e-12)
    np.testing.assert_allclose(rec["flops_per_s"], flops_step * s, rtol=1e-12)
    np.testing.assert_allclose(rec["mfu"], flops_step * s / (PEAK * devices), rtol=1e-12)
  # Timings stay out of the train records, which resumes compare bit for bit.
  assert not {"steps_per_s", "mfu"} & set(read_metrics(workdir, "train")[0])


def test_profile_window_writes_a_trace(gpt_run):
  _, workdir, summary = gpt_run
  assert summary["step"] == 6
  traces = list((workdir / "profile").rglob("*.xplane.pb"))
  assert traces and traces[0].stat().st_size > 0


def test_detailed_watch_records_agree_with_the_saved_state_and_grad_norm(gpt_run):
  _, workdir, _ = gpt_run
  records = {r["step"]: r for r in read_metrics(workdir, "watch")}
  assert sorted(records) == [2, 4, 6]
  # The norms of step 6 are those of the final state, read back from its checkpoint.
  _, state = load_state(workdir)
  for i in range(2):
    expected = np.sqrt(sum(np.sum(np.square(np.asarray(x[i], np.float64)))
                           for x in jax.tree.leaves(state["params"]["h"])))
    np.testing.assert_allclose(records[6][f"param_norm/h/{i}"], expected, rtol=1e-5)
  train = {r["step"]: r for r in read_metrics(workdir, "train")}
  for step, rec in records.items():
    # The groups partition the parameters: their grad norms make up the global one.
    by_group = np.sqrt(sum(v ** 2 for k, v in rec.items() if k.startswith("grad_norm/")))
    np.testing.assert_allclose(by_group, train[step]["grad_norm"], rtol=1e-4)
    assert {"attn_max_logit/h/0", "attn_max_logit/h/1", "logit_max", "logit_std"} <= set(rec)
    values = [v for k, v in rec.items() if k not in ("step", "split")]
    assert np.all(np.isfinite(values)) and rec["logit_std"] > 0


def test_bad_profile_windows_are_one_line_errors():
  for window in ("(5, 20)", "(4, 2)", "(0, 3)"):
    with pytest.raises(ConfigError, match=r"^train.profile_steps: expected \(start, stop\)"):
      load_config("moons_mlp", ["train.steps=10", f"train.profile_steps={window}"])


EXPERIMENT_WITH_HOOKS = """
import json
from moons_mlp import get_config
from jaxdl.train import Hook
from jaxdl.train.trackers import Tracker, register_tracker

class Seen(Hook):
  def on_step_end(self, step, metrics):
    with open("seen.jsonl", "a") as f:  # in the test's working directory
      f.write(json.dumps({"step": step, **metrics}) + "\\n")

def hooks(config):
  return [Seen()]

@register_tracker("seen")
class SeenTracker(Tracker):
  def log(self, step, split, metrics):
    with open("tracked.jsonl", "a") as f:
      f.write(json.dumps({"step": step, "split": split}) + "\\n")

  def finish(self, summary):
    with open("tracked.jsonl", "a") as f:
      f.write(json.dumps({"summary_step": summary["step"]}) + "\\n")
"""


def test_cli_profile_hooks_jaxpr_flops_and_ema_eval(tmp_path, capsys, monkeypatch):
  """moons_mlp has no FLOP formula: the step's jaxpr counts its matmuls, forward and backward.
  The experiment file's `hooks(config)` sees each logged step's metrics with the throughput.
  With train.eval_ema the average is evaluated too, and is what the summary reports."""
  monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent.parent / "experiments"))
  monkeypatch.chdir(tmp_path)
  (tmp_path / "moons_hooked.py").write_text(EXPERIMENT_WITH_HOOKS)
  workdir = tmp_path / "w"
  assert cli.main(["train", str(tmp_path / "moons_hooked.py"), "--workdir", str(workdir),
                   "--profile", "--no-progress", "--set", "train.steps=5",
                   "--set", "train.log_every=2", "--set", "train.plot=False",
                   "--set", "train.peak_flops=1e12", "--set", "data.batch_size=64",
                   "--set", "optim.ema_decay=0.5", "--set", "train.eval_ema=True",
                   "--set", "train.loggers=('tensorboard', 'seen')"]) == 0
  tracked = [json.loads(line) for line in (tmp_path / "tracked.jsonl").read_text().splitlines()]
  assert {r.get("split") for r in tracked[:-1]} == {"train", "throughput", "eval", "eval_ema"}
  assert tracked[-1] == {"summary_step": 5}
  seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
  rates = read_metrics(workdir, "throughput")
  assert [r["step"] for r in seen] == [1, 2, 4, 5] and [r["step"] for r in rates] == [2, 4, 5]
  assert [r["mfu"] for r in seen[1:]] == [r["mfu"] for r in rates]
  config = json.loads((workdir / "config.json").read_text())
  assert config["train"]["profile_steps"] == [3, 5]
  assert list((workdir / "profile").rglob("*.xplane.pb"))
  kernels = [p for p in jax.tree.leaves(build(load_config("moons_mlp")[0]).abstract_state()
                                        .params) if p.ndim == 2]
  # Forward, kernel gradient and input gradient, 2 B d_in d_out each, but no input gradient
  # for the first layer (the data takes none).
  sizes = [int(k.shape[0] * k.shape[1]) for k in kernels]
  matmul = 2 * 64 * (3 * sum(sizes) - sizes[0])
  for rec in rates:
    flops_step = rec["flops_per_s"] / rec["steps_per_s"]
    np.testing.assert_allclose(flops_step, matmul, rtol=1e-9)
  # eval_ema/ is the loss of the saved average, computed here from the checkpoint.
  _, saved = load_state(workdir)
  r = build(load_config("moons_mlp", ["data.batch_size=64"])[0])
  losses = [(float(r.task.loss_fn(r.model.apply, find_ema(saved["opt_state"]),
                                  saved["model_state"], batch, {}, False)[0]), len(batch["y"]))
            for batch in r.ds.eval_batches()]
  ema_loss = sum(loss * n for loss, n in losses) / sum(n for _, n in losses)
  (averaged,), (plain,) = read_metrics(workdir, "eval_ema"), read_metrics(workdir, "eval")
  np.testing.assert_allclose(averaged["loss"], ema_loss, rtol=1e-5)
  assert abs(plain["loss"] - averaged["loss"]) > 1e-4
  assert json.loads((workdir / "summary.json").read_text())["eval"]["loss"] == averaged["loss"]
  capsys.readouterr()
  for override, error in (("train.eval_ema=True", "train.eval_ema: the run keeps no parameter "
                           "average"),
                          ("train.loggers=('tensorboard', 'nope')",
                           "train.loggers: unknown logger 'nope'")):
    assert cli.main(["train", "moons_mlp", "--workdir", str(tmp_path / "x"), "--set",
                     override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and error in err[0]
  assert cli.main(["train", "moons_mlp", "--workdir", str(tmp_path / "x"),
                   "--set", "train.profile_steps=(3, 9)", "--set", "train.steps=5"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "train.profile_steps" in err[0]
  assert not (tmp_path / "x").exists()


def test_peak_is_measured_once_per_device_kind_and_cached(tmp_path, monkeypatch):
  timed = []
  monkeypatch.setenv("JAXDL_CACHE", str(tmp_path))  # the one cache root (jaxdl.cache)
  monkeypatch.setattr(throughput, "_PEAKS", {})
  monkeypatch.setattr(throughput, "measure_peak", lambda n, dtype: timed.append(n) or 5e9)
  cpu = SimpleNamespace(platform="cpu", device_kind="cpu")
  assert throughput.device_peak("float32", cpu)[0] == 5e9
  monkeypatch.setattr(throughput, "_PEAKS", {})   # a new process: read from the file
  peak, source = throughput.device_peak("float32", cpu)
  assert peak == 5e9 and "measured earlier" in source and timed == [1024]
  assert (tmp_path / "peak_flops.json").exists()
  tpu = SimpleNamespace(platform="tpu", device_kind="TPU v4")
  assert throughput.device_peak("bfloat16", tpu) == (275e12, "datasheet bf16 peak of TPU v4")


def test_a_run_counts_the_bench_gpts_flops_exactly():
  """`jaxdl train` of the bench's CPU GPT (char_gpt with its sizes) and `jaxdl bench gpt` count
  the same FLOPs per step, so their MFUs differ only by the measured times and peaks."""
  from jaxdl.bench import gpt as bench
  from jaxdl.models import build_model
  s = bench.CPU_SETUP
  config, _ = load_config("char_gpt", [f"model.d_model={s.d_model}", f"model.n_layer={s.n_layer}",
                                       f"model.n_head={s.n_head}", f"model.block_size={s.context}",
                                       f"data.context_length={s.context}",
                                       f"data.batch_size={s.batch}"])
  r = SimpleNamespace(config=config, task=SimpleNamespace(kind=TASKS["lm"]),
                      data=SimpleNamespace(batch_size=s.batch), model=build_model(config.model))
  flops, how = throughput.count_step_flops(r, None, None, {"x": np.zeros((s.batch, s.context))})
  state, _ = bench.jaxdl_step(s, abstract=True)
  n_matmul = sum(x.size for x in jax.tree.leaves(state.params)) - s.context * s.d_model
  assert flops == bench.flops_per_token(s, n_matmul) * s.tokens and "6N + 12LDT" in how


def test_the_trace_is_read_back_per_step_and_drawn(gpt_run, tmp_path):
  from jaxdl.train.plots import plot_profile
  from jaxdl.train.profiling import read_trace
  _, workdir, _ = gpt_run
  trace = read_trace(workdir)
  assert [s for s, _, _ in trace.steps] == [3, 4]   # the window's StepTraceAnnotations
  assert {m for m, _, _ in trace.executions} >= {"jit_train_step"}
  assert all(d > 0 for _, _, d in trace.executions) and sum(trace.op_ms.values()) > 0
  # The device work of step 4 ends after its dispatch began (the profiler waits for it).
  assert max(a + d for _, a, d in trace.executions) > trace.steps[-1][1]
  out = plot_profile(workdir, tmp_path / "profile.png")
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
