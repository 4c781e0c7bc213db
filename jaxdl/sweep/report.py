"""`jaxdl sweep report`: one row per point of a sweep, a metric's statistics over its seeds.

For each run, from its workdir: the metric's records in metrics.jsonl (`eval/loss`: the `eval`
split's `loss`; a step logged twice, as a resumed run does, counts once, its last record), its
final value (summary.json's, for a finished run) and its best (min, or max for `--mode max`).
For each point, over its finished runs' values x_1..x_n:

  mean  m = (1/n) sum x_i,   95% t interval  m +- t_{0.975, n-1} s / sqrt(n),
  s^2 = (1/(n-1)) sum (x_i - m)^2   (no interval for n = 1),

and the counts of finished / failed / running / pending runs; of the points whose every seed
finished, the one with the best mean final value is marked '*' (none while seeds are missing).
A run's status comes from its workdir, not only from sweep.json (a killed
sweep leaves `running` behind): `running` while a live process holds its lock, `finished` with
summary.json, `failed` as recorded (exit code and error) or when its loss or metric is
non-finite, else `pending`. A failed run is a row with its error; nothing in a run makes the
report fail.

A search's directory (`jaxdl sweep --search`) is reported per trial: a row each, its values, its
status (`pruned` besides the above, for a trial its pruner stopped), the final and best value of
the search's metric (the default `--metric`), the best finished trial marked '*', and the
counts of finished / failed / pruned / running / pending trials.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib

from jaxdl.sweep import index as jindex
from jaxdl.sweep.scheduler import lock_holder
from jaxdl.train import plots
from jaxdl.train.workdir import read_summary
from jaxdl.train.writers import read_metrics, read_records

STATUSES = (jindex.FINISHED, jindex.FAILED, jindex.RUNNING, jindex.PENDING)
SEARCH_STATUSES = (jindex.FINISHED, jindex.FAILED, jindex.PRUNED, jindex.RUNNING, jindex.PENDING)


def split_metric(metric: str) -> tuple[str, str]:
  """`eval/loss` -> ('eval', 'loss'); a bare `loss` is the eval split's."""
  split, _, key = metric.rpartition("/")
  return split or "eval", key


def default_mode(metric: str) -> str:
  return "max" if "acc" in split_metric(metric)[1] else "min"


def t_interval(values, level: float = 0.95) -> tuple[float | None, float | None]:
  """(mean, half-width of the two-sided t interval); (None, None) for no values, (mean, None)
  for one."""
  n = len(values)
  if n == 0:
    return None, None
  mean = sum(values) / n
  if n == 1:
    return mean, None
  from scipy import stats  # a dependency of scikit-learn, which jaxdl requires
  s = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
  return mean, float(stats.t.ppf(0.5 + level / 2, n - 1)) * s / math.sqrt(n)


def _series(workdir: pathlib.Path, split: str, key: str) -> list[tuple[int, float | None]]:
  """(step, value) of `split`'s `key`, one per step (the last record of a step logged twice)."""
  by_step = {}
  for r in read_records(workdir / "metrics.jsonl"):
    if r.get("split") == split and key in r:
      by_step[r["step"]] = r[key]
  return sorted(by_step.items())


def _nonfinite(series) -> int | None:
  return next((step for step, v in series if v is None or not math.isfinite(v)), None)


def run_result(sweep_dir: pathlib.Path, name: str, record: dict, metric: str,
               mode: str) -> dict:
  """One run's status, error, final and best value of `metric`."""
  split, key = split_metric(metric)
  workdir = sweep_dir / record["workdir"]
  # A pruned trial's run went on to save a later step after its pruner stopped it: its values
  # end where it was pruned.
  last = record.get("pruned_at") if record.get("status") == jindex.PRUNED else None
  series = [(s, v) for s, v in _series(workdir, split, key) if last is None or s <= last]
  summary = read_summary(workdir)
  if lock_holder(workdir):
    status, error = jindex.RUNNING, None
  elif record.get("status") == jindex.PRUNED:  # even with summary.json: see search.py
    status, error = jindex.PRUNED, record.get("error")
  elif summary is not None:
    status, error = jindex.FINISHED, None
  elif record.get("status") == jindex.FAILED:
    status, error = jindex.FAILED, record.get("error") or f"exit code {record.get('returncode')}"
  else:
    status, error = jindex.PENDING, record.get("error")
  bad_loss, bad_metric = _nonfinite(_series(workdir, "train", "loss")), _nonfinite(series)
  judged = status not in (jindex.RUNNING, jindex.PRUNED)
  if judged and (bad_loss is not None or bad_metric is not None):
    what, step = ("train/loss", bad_loss) if bad_loss is not None else (metric, bad_metric)
    status = jindex.FAILED
    error = error if error and record.get("status") == jindex.FAILED else (
        f"non-finite {what} at step {step}")
  finite = [v for _, v in series if v is not None and math.isfinite(v)]
  final = finite[-1] if finite and series[-1][1] == finite[-1] else None
  if status == jindex.FINISHED:
    stored = (summary.get(split) or {}).get(key)
    final = stored if isinstance(stored, (int, float)) else final
    if final is None:
      error = f"no {metric} recorded"
  best = (min(finite) if mode == "min" else max(finite)) if finite else None
  return {"run": name, "point": record["point"], "seed": record["seed"],
          "values": record.get("values") or {}, "status": status, "error": error,
          "final": final, "best": best, "workdir": str(workdir), "last_step": last}


def summarize(sweep_dir, metric: str | None = None, mode: str | None = None) -> dict:
  """The report of the sweep in `sweep_dir`: {metric, mode, keys, statuses, rows (one per point;
  a search's: one per trial), runs}. `metric` defaults to a search's, else eval/loss; `mode` to
  a search's for its metric, else max for accuracies and min otherwise."""
  sweep_dir = pathlib.Path(sweep_dir)
  index = jindex.read(sweep_dir)
  if index is None:
    raise FileNotFoundError(f"{sweep_dir}: no {jindex.INDEX} (not a sweep directory)")
  search = index.get("search") if isinstance(index.get("search"), dict) else None
  metric = metric or (search or {}).get("metric") or "eval/loss"
  if mode is None and search and search.get("metric") == metric:
    mode = search.get("mode")
  mode = mode or default_mode(metric)
  runs = [run_result(sweep_dir, name, rec, metric, mode) for name, rec in index["runs"].items()]
  points: dict[str, list[dict]] = {}
  for r in runs:
    points.setdefault(r["point"], []).append(r)
  rows = [_row(point, results) for point, results in points.items()]
  # A point is a candidate only when every seed of it finished: a mean over the seeds that
  # happened to finish (a vanished run's point, 1/0/0/1) is not that point's result.
  scored = [r for r in rows if r["final_mean"] is not None and r[jindex.FINISHED] == r["seeds"]]
  if scored:
    pick = min if mode == "min" else max
    pick(scored, key=lambda r: r["final_mean"])["best_point"] = True
  keys = list((search or {}).get("space") or index.get("grid") or {})
  return {"sweep": str(sweep_dir), "experiment": index.get("experiment"), "metric": metric,
          "mode": mode, "keys": keys, "search": search,
          "statuses": SEARCH_STATUSES if search else STATUSES, "rows": rows, "runs": runs}


def _row(point: str, results: list[dict]) -> dict:
  done = [r for r in results if r["status"] == jindex.FINISHED]
  final_mean, final_ci = t_interval([r["final"] for r in done if r["final"] is not None])
  best_mean, best_ci = t_interval([r["best"] for r in done if r["best"] is not None])
  errors = [f"seed {r['seed']}: {r['error']}" for r in results
            if r["error"] and r["status"] in (jindex.FAILED, jindex.PRUNED)]
  return {"point": point, "values": results[0]["values"], "seeds": len(results),
          **{s: sum(r["status"] == s for r in results) for s in SEARCH_STATUSES},
          "final_mean": final_mean, "final_ci95": final_ci, "best_mean": best_mean,
          "best_ci95": best_ci, "error": "; ".join(errors) or None, "best_point": False}


def _pm(mean, half) -> str:
  if mean is None:
    return "-"
  return f"{mean:.4g}" + (f" ± {half:.2g}" if half is not None else "")


def format_table(report: dict) -> str:
  """The report as a text table (fin/fail/run/pend: the runs of the point by status)."""
  if report.get("search"):
    return format_search_table(report)
  header = ["", "point", "fin/fail/run/pend", f"final {report['metric']}",
            f"best {report['metric']} ({report['mode']})", "error"]
  lines = [header]
  for r in report["rows"]:
    counts = "/".join(str(r[s]) for s in STATUSES)
    lines.append(["*" if r["best_point"] else "", r["point"], counts,
                  _pm(r["final_mean"], r["final_ci95"]), _pm(r["best_mean"], r["best_ci95"]),
                  r["error"] or ""])
  widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
  out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1]
         for line in lines]
  out.append(f"mean ± 95% t interval over finished seeds; * the best mean final "
             f"{report['metric']} ({report['mode']}), every seed finished")
  return "\n".join(line.rstrip() for line in out)


def _short(text: str) -> str:
  try:
    return f"{float(text):.4g}" if text not in ("True", "False") else text
  except ValueError:
    return text


def _columns(lines: list[list[str]]) -> list[str]:
  """Cells padded to their column's width; the last column is not padded."""
  widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
  return [("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1]).rstrip()
          for line in lines]


def format_search_table(report: dict) -> str:
  """A search's report as a text table: one line per trial, then the counts."""
  metric, search = report["metric"], report["search"]
  header = ["", "trial", *report["keys"], "status", f"final {metric}",
            f"best {metric} ({report['mode']})", "error"]
  lines = [header]
  for r in report["rows"]:
    run = next(x for x in report["runs"] if x["point"] == r["point"])
    status = next(s for s in SEARCH_STATUSES if r[s])
    lines.append(["*" if r["best_point"] else "", r["point"],
                  *(_short(r["values"].get(k, "")) for k in report["keys"]), status,
                  _pm(run["final"] if status == jindex.FINISHED else None, None),
                  _pm(run["best"], None),
                  (r["error"] or "").removeprefix("seed ").partition(": ")[2]])
  counts = ", ".join(f"{sum(r[s] for r in report['rows'])} {s}" for s in SEARCH_STATUSES)
  out = _columns(lines)
  n = len(report["rows"])
  out.append(f"{n} trial{'s' * (n != 1)} ({search.get('sampler')}, sampler seed "
             f"{search.get('sampler_seed')}): {counts}; * the best final {metric} "
             f"({report['mode']}) of the finished trials")
  return "\n".join(line.rstrip() for line in out)


def write_csv(report: dict, path) -> pathlib.Path:
  """One line per point: the swept values, the counts and the statistics."""
  path = pathlib.Path(path)
  fields = ["point", *report["keys"], "seeds", *report.get("statuses", STATUSES), "final_mean",
            "final_ci95",
            "best_mean", "best_ci95", "best_point", "error"]
  with path.open("w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    for r in report["rows"]:
      writer.writerow({**{k: r[k] for k in fields if k in r}, **r["values"]})
  return path


def write_json(report: dict, path) -> pathlib.Path:
  path = pathlib.Path(path)
  path.write_text(json.dumps(report, indent=2))
  return path


def _numbers(texts) -> list[float] | None:
  try:
    return [float(t) for t in texts]
  except (TypeError, ValueError):
    return None


def plot_metric(report: dict, key: str, out) -> pathlib.Path:
  """The final metric against `key`, one line per combination of the other swept keys: the mean
  over seeds with its 95% interval as error bars where points have several finished seeds; one
  marker per run where each has one (a search's trials, a grid of one seed), which claims no
  mean and no interval."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  rows = [r for r in report["rows"] if r["final_mean"] is not None and key in r["values"]]
  single = all(r[jindex.FINISHED] == 1 for r in rows)
  groups: dict[str, list[dict]] = {}
  for r in rows:
    rest = "" if report.get("search") else ",".join(  # a search's trials: one scatter
        f"{k}={v}" for k, v in sorted(r["values"].items()) if k != key)
    groups.setdefault(rest, []).append(r)
  texts = sorted({r["values"][key] for r in rows}, key=lambda t: (_numbers([t]) is None, t))
  numeric = _numbers(texts)
  for rest, members in groups.items():
    members = sorted(members, key=lambda r: texts.index(r["values"][key]))
    xs = ([float(r["values"][key]) for r in members] if numeric is not None
          else [texts.index(r["values"][key]) for r in members])
    ys = [r["final_mean"] for r in members]
    style = {"linestyle": "none" if report.get("search") else "-", "label": rest or None}
    if single:
      ax.plot(xs, ys, marker="o", **style)
    else:
      ax.errorbar(xs, ys, yerr=[r["final_ci95"] or 0.0 for r in members], marker="o",
                  capsize=3, **style)
  if numeric is not None and numeric and min(numeric) > 0 and max(numeric) >= 10 * min(numeric):
    ax.set_xscale("log")
  if numeric is None:
    ax.set_xticks(range(len(texts)), texts)
  what = ("one run each: a trial" if report.get("search") else "one seed") if single else (
      "mean over seeds, 95% t interval")
  ax.set(xlabel=key, ylabel=f"final {report['metric']} ({what})")
  if any(groups):
    ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return pathlib.Path(out)


def curve_label(run: dict) -> str:
  """A run's curve label: its settings (`optim.lr=0.0106`, the seed where several), not its
  directory's name; a pruned trial says where it was pruned."""
  values = ",".join(f"{k}={_short(v)}" for k, v in run["values"].items()) or run["run"]
  seed = f",seed={run['seed']}" if "trial" not in run["run"] and run["values"] else ""
  pruned = f" (pruned at {run['last_step']})" if run.get("last_step") is not None else ""
  return f"{values}{seed}{pruned}"


def plot_figures(report: dict, out_dir) -> list[pathlib.Path]:
  """`<metric>_vs_<key>.png` for every swept key and `curves.png` (every run's loss curve,
  through `jaxdl plot`'s figure, labelled by its settings, a pruned trial's ending where it was
  pruned); runs without a logged loss are left out."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  stem = report["metric"].replace("/", "_")
  out = [plot_metric(report, key, out_dir / f"{stem}_vs_{key}.png") for key in report["keys"]]
  logged = [r for r in report["runs"]
            if any(m.get("loss") is not None for m in read_metrics(r["workdir"], "train"))]
  if logged:
    out.append(plots.plot_runs([r["workdir"] for r in logged], out_dir / "curves.png",
                               labels=[curve_label(r) for r in logged],
                               last_steps=[r.get("last_step") for r in logged]))
  return out
