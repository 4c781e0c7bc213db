"""`jaxdl sweep --search`: bad flags refused before anything starts, a study's stopped trials
settled and resumed (in-process, nothing trains), and one real TPE search with median pruning
over a learning rate range that diverges, grown from 3 to 5 trials by a rerun (slow)."""

import collections
import contextlib
import io
import json
import pathlib
import sys

import pytest

from jaxdl import cli
from jaxdl.config import ConfigError, load_config
from jaxdl.sweep import index as jindex
from jaxdl.sweep import report, search, space

pytest.importorskip("optuna")
optuna = space.import_optuna()  # its INFO lines silenced, as the command does

EXP = "moons_mlp:smoke"  # 20 steps
BASE = load_config(EXP)[0]  # the config the CLI hands a sweep (`jaxdl.cli.sweep`)
# Evaluated every 5 steps: the pruner judges steps 5, 10 and 15 (20 is the last: never judged).
SHARED = ["train.eval_every=5", "train.plot=False", "train.loggers=()", "train.count_flops=False"]
LR = "optim.lr=loguniform:1e-3:1e3"  # Adam on moons: lr >= 0.5 gives eval losses of 16 to 1e12


def _sets():
  return [a for s in SHARED for a in ("--set", s)]


# --- flags (in-process: configs only, nothing starts) ---

@pytest.mark.parametrize("flags, message", [
    (["--space", "optim.lrr=uniform:0:1"], "optim.lrr: unknown key"),
    (["--space", "optim.lr=unif:0:1"], "--space optim.lr=unif:0:1: expected KIND:ARGS, KIND one "
                                       "of uniform, loguniform, int, logint, choice"),
    (["--space", "optim.lr=uniform:1"], "--space optim.lr=uniform:1: expected uniform:LOW:HIGH"),
    (["--space", "optim.lr=loguniform:0:1"], "--space optim.lr=loguniform:0:1: a log range "
                                             "needs LOW > 0"),
    (["--space", "optim.lr=uniform:1:0.1"], "--space optim.lr=uniform:1:0.1: LOW must be below"),
    (["--space", "optim.lr=uniform:-1:1"], "optim.lr: must be >= 0, got -1.0 (--space optim.lr)"),
    (["--space", "train.steps=uniform:1:9"], "--space train.steps: uniform needs a float key"),
    (["--space", "optim.lr=choice:0.1,,1"], "--space optim.lr: an empty value in '0.1,,1'"),
    (["--space", "seed=int:0:3"], "--space seed: the seed is not searched"),
    (["--space", "optim.lr=uniform:0:1", "--space", "optim.lr=uniform:0:2"],
     "--space optim.lr: given twice"),
    ([], "--search: give the searched keys with --space KEY=KIND:ARGS"),
    (["--space", LR, "--trials", "0"], "--trials: expected a count >= 1, got 0"),
    (["--space", LR, "--mode", "best"], "--mode 'best': expected min or max"),
    (["--space", LR, "--metric", "valid/loss"], "--metric 'valid/loss': expected train/KEY or"),
    (["--space", LR, "--prune", "mean"], "--prune 'mean': expected none, median[:STARTUP"),
    (["--space", LR, "--prune", "percentile:100"], "--prune 'percentile:100': P must be in"),
    (["--space", LR, "--search", "grid"], "--search 'grid': expected random or tpe[:STARTUP]"),
    (["--space", LR, "--grid", "optim.lr=1"], "sweep: --grid and --search exclude each other"),
    (["--space", LR, "--seeds", "2"], "sweep: --seeds does not apply to a search"),
])
def test_a_bad_search_flag_is_one_line_exit_2_and_creates_nothing(flags, message, tmp_path,
                                                                  capsys):
  out = tmp_path / "search"
  assert cli.main(["sweep", EXP, "--search", "tpe", "--trials", "2", *flags, "--out",
                   str(out)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"jaxdl: error: {message}"), err
  assert not out.exists()


def test_search_flags_belong_to_a_search(tmp_path, capsys):
  assert cli.main(["sweep", EXP, "--search", "tpe", "--space", LR, "--out", str(tmp_path)]) == 2
  assert cli.main(["sweep", EXP, "--grid", "optim.lr=1e-2", "--trials", "3"]) == 2
  assert cli.main(["sweep", "report", str(tmp_path), "--search", "tpe"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      "jaxdl: error: --search: give the number of trials with --trials N",
      "jaxdl: error: sweep: --trials belongs to a search (--search random|tpe)",
      "jaxdl: error: sweep report: --search belongs to running a search"]
  assert list(tmp_path.iterdir()) == []


def test_without_optuna_a_search_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
  assert cli.main(["sweep", EXP, "--search", "tpe", "--space", LR, "--trials", "2", "--out",
                   str(tmp_path / "s")]) == 2
  assert capsys.readouterr().err.splitlines() == [
      'jaxdl: error: --search needs optuna: pip install -e ".[sweep]"']
  assert not (tmp_path / "s").exists()


def test_a_space_is_typed_by_the_config():
  s = space.plan(EXP, BASE, [LR, "train.steps=int:10:30", "model.hidden=choice:(8,8),(16, 16)"],
                 search="tpe:4", trials=3, prune="median:2:5")
  assert s.settings()["space"] == {"optim.lr": "loguniform:0.001:1000.0",
                                   "train.steps": "int:10:30",
                                   "model.hidden": "choice:(8,8),(16,16)"}
  assert (s.sampler, s.startup, s.prune, s.metric, s.mode) == ("tpe", 4, (50.0, 2, 5),
                                                               "eval/loss", "min")
  s = space.plan(EXP, BASE, [LR], search="random", trials=1, shared=["train.eval_every=0"],
                 metric="eval/accuracy")
  assert (s.metric, s.mode, s.prune) == ("eval/accuracy", "max", None)
  assert space.plan(EXP, BASE, [LR], search="random", trials=1,
                    shared=["train.eval_every=0"]).metric == "train/loss"  # nothing to prune on
  with pytest.raises(ConfigError, match=r"^--space optim.lr: also fixed by --set"):
    space.plan(EXP, BASE, [LR], search="random", trials=1, shared=["optim.lr=0.1"])


# --- a study's stopped trials (in-process: hand-written workdirs, nothing trains) ---

def _driver(sweep, plan, lines):
  idx = jindex.merge_search(jindex.read(sweep), plan)
  jindex.write(sweep, idx)
  study = space.open_study(optuna, sweep, plan)
  return search._Driver(optuna, sweep, plan, study, idx, lines.append)


def test_a_rerun_settles_stopped_trials_and_resumes_the_rest_with_their_values(tmp_path,
                                                                              monkeypatch):
  sweep = tmp_path / "search"
  (sweep / "logs").mkdir(parents=True)
  plan = space.plan(EXP, BASE, [LR], search="tpe", trials=5, shared=SHARED, prune="median")
  lines = []
  first = _driver(sweep, plan, lines)
  for _ in range(3):
    first.next_trial(collections.deque(), 5)
  values = {n: first.index["runs"][search.run_name(n)]["values"] for n in range(3)}
  # As a killed sweep leaves them: trial 0 was running, trial 1 being pruned, trial 2 ran to
  # its end meanwhile; trial 3 was asked and given its value, but never recorded.
  runs = first.index["runs"]
  runs["trial-000"]["status"] = runs["trial-002"]["status"] = jindex.RUNNING
  runs["trial-001"].update(status=jindex.PRUNED, error="pruned at step 5 (eval/loss 22.4)")
  w = sweep / "runs" / "trial-002"
  w.mkdir(parents=True)
  (w / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "split": "eval", "loss": v})
                                           + "\n" for s, v in ((5, 0.4), (10, 0.3), (20, 0.25))))
  (w / "summary.json").write_text(json.dumps({"step": 20, "eval": {"loss": 0.25}}))
  jindex.write(sweep, first.index)
  space.seed_sampler(optuna, first.study, plan, 3)
  asked = first.study.ask()
  lr3 = asked.suggest_float("optim.lr", 1e-3, 1e3, log=True)

  again = _driver(sweep, plan, lines)
  resume = again.settle()
  assert [t.name for t in resume] == ["trial-000", "trial-003"]
  trials = again.study.get_trials()
  assert [t.state.name for t in trials] == ["RUNNING", "PRUNED", "COMPLETE", "RUNNING"]
  assert trials[2].value == 0.25  # reported, the last step too (never judged)
  assert trials[2].intermediate_values == {5: 0.4, 10: 0.3, 20: 0.25}
  # Resumed with the values they had, never resampled; then one new trial, then none.
  assert again.next_trial(resume, 5).name == "trial-000"
  assert again.index["runs"]["trial-000"]["values"] == values[0]
  assert again.next_trial(resume, 5).name == "trial-003"
  assert again.index["runs"]["trial-003"]["values"] == {"optim.lr": repr(lr3)}
  # A combination the engine refuses is a failed trial with its error; no run starts.
  monkeypatch.setattr(search.grid, "check_config", lambda c: (_ for _ in ()).throw(
      ConfigError("optim.lr: refused here")))
  assert again.next_trial(resume, 5) is None and not resume
  assert again.index["runs"]["trial-004"]["error"] == "optim.lr: refused here"
  # A run that exits 1 on a non-finite loss is a failed trial: a row with its error.
  again.conclude(again.track(again.study.get_trials()[0]), jindex.FAILED,
                 "jaxdl: loss became non-finite at step 3", 1)
  states = [t.state.name for t in again.study.get_trials()]
  assert states == ["FAIL", "PRUNED", "COMPLETE", "RUNNING", "FAIL"]
  table = report.format_table(report.summarize(sweep))
  assert "1 finished, 2 failed, 1 pruned, 0 running, 1 pending" in table
  assert "jaxdl: loss became non-finite at step 3" in table and "*  trial-002" in table


def test_a_search_report_says_what_it_shows(tmp_path, monkeypatch):
  """Trials are single runs: the figure claims no mean or interval; curves are labelled by their
  settings; a pruned trial's values and curve end at the step it was pruned at, though its run
  went on to save a later one."""
  import matplotlib.figure
  from jaxdl.train import plots
  sweep = tmp_path / "search"
  plan = space.plan(EXP, BASE, [LR], search="random", trials=2, shared=SHARED)
  idx = jindex.merge_search(None, plan)
  for n, lr, losses, pruned_at in ((0, "0.01", (0.4, 0.3), None), (1, "5.0", (20.0, 9.0), 5)):
    name = search.run_name(n)
    w = sweep / "runs" / name
    w.mkdir(parents=True)
    (w / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "split": split, "loss": v}) + "\n"
        for step, v in zip((5, 10), losses) for split in ("train", "eval")))
    if pruned_at is None:
      (w / "summary.json").write_text(json.dumps({"step": 10, "eval": {"loss": losses[-1]}}))
    idx["runs"][name] = {"point": name, "trial": n, "seed": 0, "values": {"optim.lr": lr},
                         "workdir": f"runs/{name}", "log": f"logs/{name}.log",
                         "status": jindex.FINISHED if pruned_at is None else jindex.PRUNED,
                         "pruned_at": pruned_at, "error": None}
  jindex.write(sweep, idx)
  rep = report.summarize(sweep)
  runs = {r["run"]: r for r in rep["runs"]}
  assert (runs["trial-001"]["final"], runs["trial-001"]["best"]) == (20.0, 20.0)  # not 9.0
  drawn, ylabels = {}, []
  plot_runs = plots.plot_runs

  def spy(workdirs, out, labels=None, last_steps=None):
    drawn.update(labels=labels, last_steps=last_steps)
    return plot_runs(workdirs, out, labels=labels, last_steps=last_steps)

  monkeypatch.setattr(plots, "plot_runs", spy)
  savefig = matplotlib.figure.Figure.savefig
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (
      ylabels.append(fig.axes[0].get_ylabel()), savefig(fig, *a, **k))[1])
  report.plot_figures(rep, tmp_path / "figures")
  assert ylabels[0] == "final eval/loss (one run each: a trial)"
  assert drawn == {"labels": ["optim.lr=0.01", "optim.lr=5 (pruned at 5)"],
                   "last_steps": [None, 5]}


# --- one real search: 3 trials, then grown to 5 by the same command (slow) ---
# Five, not more: trials 3 and 4 are the two that diverge and are pruned; each further trial is
# one more `jaxdl train` process (about 4 CPU-s) that shows nothing new.

def _search(out, trials):
  """Runs the search in-process (the runs are `jaxdl train` subprocesses); (exit code, stdout,
  stderr)."""
  stdout, stderr = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    code = cli.main(["sweep", EXP, "--search", "tpe", "--space", LR, "--trials", str(trials),
                     "--prune", "median", "--sampler-seed", "9", "--jobs", "2", "--out",
                     str(out), *_sets()])
  return code, stdout.getvalue(), stderr.getvalue()


def _trials(out):
  study = optuna.load_study(study_name=space.STUDY_NAME, storage=optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(str(out / space.STUDY_FILE))))
  return [(t.number, t.state.name, t.params, t.value, t.intermediate_values)
          for t in study.get_trials()]


@pytest.fixture(scope="module")
def grown_search(tmp_path_factory):
  """Sampler seed 9 draws lr 0.164, 0.0106, 0.0591 for trials 0-2 (all converge: no pruning
  before 3 finished) and 0.834, 216 for trials 3-4 (TPE's random startup: both diverge)."""
  out = tmp_path_factory.mktemp("search") / "s"
  first = _search(out, 3)
  after_first = _trials(out)
  second = _search(out, 5)
  return out, first, after_first, second


@pytest.mark.slow
def test_a_tpe_search_prunes_a_diverging_trial_and_grows_on_rerun(grown_search):
  out, first, after_first, second = grown_search
  assert first[0] == 0, first[2][-2000:]
  assert [t[1] for t in after_first] == ["COMPLETE"] * 3
  assert second[0] == 0, second[2][-2000:]
  trials = _trials(out)
  assert len(trials) == 5 and trials[:3] == after_first  # the first three unchanged
  states = collections.Counter(t[1] for t in trials)
  assert states["PRUNED"] >= 1 and states["COMPLETE"] >= 3 and states["FAIL"] == 0, states
  # Trials 3 and 4 diverge and are stopped at the first step judged, against the median of
  # the finished ones.
  for number, lr in ((3, 0.834), (4, 216.0)):
    _, state, params, _, steps = trials[number]
    assert state == "PRUNED" and params["optim.lr"] == pytest.approx(lr, rel=1e-2)
    assert list(steps) == [5] and steps[5] > 10.0
  idx = json.loads((out / "sweep.json").read_text())
  assert idx["runs"]["trial-003"]["status"] == "pruned"
  assert idx["runs"]["trial-003"]["error"].startswith("pruned at step 5 (eval/loss ")
  assert idx["runs"]["trial-003"]["pruned_at"] == 5
  assert "3 finished, 0 failed" in second[1] and "0 to resume, 2 to ask" in second[2]


@pytest.mark.slow
def test_a_finished_search_reruns_nothing_and_reports_its_trials(grown_search, tmp_path,
                                                                  capsys):
  out = grown_search[0]
  before = json.loads((out / "sweep.json").read_text())["runs"]
  code, stdout, stderr = _search(out, 5)
  assert code == 0 and "0 to resume, 0 to ask" in stderr and "start" not in stderr
  runs = json.loads((out / "sweep.json").read_text())["runs"]
  assert {n: r["attempts"] for n, r in runs.items()} == {n: 1 for n in before}  # none resumed
  csv_path = tmp_path / "r.csv"
  assert cli.main(["sweep", "report", str(out), "--csv", str(csv_path), "--figures",
                   "none"]) == 0
  table = capsys.readouterr().out
  rows = report.summarize(out)["rows"]
  pruned = sum(r["pruned"] for r in rows)
  line = f"5 trials (tpe, sampler seed 9): {5 - pruned} finished, 0 failed, {pruned} pruned"
  assert line in table
  # README.md shows this search's command and that line.
  readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
  assert f"# {line}, 0 running, 0 pending" in readme
  best = min((r for r in rows if r["finished"]), key=lambda r: r["final_mean"])
  assert f"*  {best['point']}" in table
  assert csv_path.read_text().startswith("point,optim.lr,seeds,finished,failed,pruned,")
  # The same directory refuses other settings and a grid.
  with contextlib.redirect_stderr(io.StringIO()) as err:
    assert cli.main(["sweep", EXP, "--search", "random", "--space", LR, "--trials", "8",
                     "--out", str(out), *_sets()]) == 2
    assert cli.main(["sweep", EXP, "--grid", "optim.lr=0.1", "--out", str(out), *_sets()]) == 2
  assert err.getvalue().splitlines() == [
      "jaxdl: error: --out: the directory holds a search with --search 'tpe' (sweep.json "
      "sampler), not 'random'; use another --out or the same --search",
      "jaxdl: error: --out: the directory holds a search (--search); use another --out for a "
      "grid"]
