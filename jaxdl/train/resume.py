"""Resuming a workdir: which config changes a resumed run may carry, and which it may not.

A workdir's `config.json` is the config of the run it holds. A new run in that workdir resumes it
when the two configs agree on every key except the resumable ones (cadences, run length,
placement); a different experiment or config is refused with one line naming the differing keys
(`--force` resumes anyway when the saved state fits the new config, else moves the old run to
`workdir/previous-<time>/` and starts fresh). A new run length is accepted only when the
optimizer's schedule keeps every learning rate already taken (extending a WSD run in its stable
phase yes, cosine no), and an extended WSD run keeps the warmup it had even when the warmup was
given as a fraction of the run.

The new run's sections are the ones `build` parsed (`Run.optim`, `Run.train`); only the record of
the previous run (its `config.json`) is parsed here, leniently (`strict=False`): it is a run
already made, perhaps by an older jaxdl.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib

from jaxdl import optim as joptim
from jaxdl.config import diff_configs
from jaxdl.train.assembly import Run

log = logging.getLogger("jaxdl")

# Keys that may change when a run is resumed: cadences and the run length (the optimizer's
# schedule decides whether a new length keeps the learning rates already taken).
RESUMABLE_KEYS = ("train.steps", "train.eval_every", "train.log_every", "train.ckpt_every",
                  "train.keep_ckpts", "train.patience", "train.plot", "train.async_checkpoint",
                  "train.xla_cpu_workarounds",
                  "train.count_flops", "train.peak_flops", "train.profile_steps",
                  "train.watch", "train.watch_every", "train.eval_ema",
                  "train.loggers",
                  "optim.schedule.warmup_steps",  # checked by value: see check_run_length
                  "parallel.strategy", "parallel.devices", "parallel.fsdp", "parallel.expert",
                  "parallel.tensor", "parallel.sequence", "parallel.sequence_attention",
                  "description")


class WorkdirMismatchError(ValueError):
  """The workdir holds a run of a different experiment or config."""


def read_previous(workdir: pathlib.Path) -> dict | None:
  """The config (as JSON) of the run this workdir holds, or None for a new workdir."""
  path = pathlib.Path(workdir) / "config.json"
  return json.loads(path.read_text()) if path.exists() else None


def resolved_optim(optim) -> dict:
  """The `optim` section (a record's dict, or a parsed `OptimConfig`) as the optimizer it
  builds, every default filled in by its class.

  Configs compare by meaning: a key left unset (None, "the class's default") equals the same
  default written out, as in config.json files of runs from before the defaults moved into the
  optimizer classes; keys the chosen optimizer ignores are dropped.
  """
  parsed = joptim.parse_optim(optim, strict=False)  # an OptimConfig is returned as it is
  common = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed)
            if f.name not in ("optimizer", "schedule")}
  out = {"name": parsed.name, **common, **dataclasses.asdict(parsed.optimizer),
         "schedule": {"name": parsed.schedule.name, **dataclasses.asdict(parsed.schedule)}}
  return json.loads(json.dumps(out))  # tuples as lists, as in config.json


def _comparable(config_json: dict, optim: joptim.OptimConfig | None = None) -> dict:
  """`config_json` with its `optim` section resolved: from `optim` when the section is already
  parsed (the new run's), else parsed from the record."""
  if "optim" not in config_json:
    return config_json
  try:
    return {**config_json, "optim": resolved_optim(config_json["optim"] if optim is None
                                                   else optim)}
  except ValueError:  # a record this jaxdl cannot parse: compare it as written
    return config_json


def check_same_run(workdir, previous: dict | None, config_json: dict, force: bool, *,
                   optim: joptim.OptimConfig | None = None) -> bool:
  """Refuses a workdir holding another experiment or config (unless `force`).

  `optim`: the new run's parsed `optim` section (`Run.optim`), compared without parsing
  `config_json['optim']` again. Returns whether the configs differ (only possible under
  `force`): the caller then resumes if the saved state fits the new config, else moves the old
  run aside (`jaxdl.train.run`).
  """
  if previous is None:
    return False
  differing = [d for d in diff_configs(_comparable(previous), _comparable(config_json, optim))
               if not any(d.startswith(k + ":") for k in RESUMABLE_KEYS)]
  # Keys that did not exist when the old run started (a newer jaxdl) are not a different config.
  added = [d for d in differing if ": '<missing>' -> " in d]
  if added:
    log.warning("config keys new since this workdir's run (resuming with them): %s",
                "; ".join(added))
  differing = [d for d in differing if d not in added]
  if differing and not force:
    raise WorkdirMismatchError(
        f"workdir {workdir} holds a run with a different config ({'; '.join(differing)}); "
        f"use another --workdir or --force to resume anyway")
  return bool(differing)


def pin_wsd_warmup(r: Run, previous: dict | None) -> Run:
  """Extending a WSD run keeps the warmup it had: a `warmup_frac` would move with train.steps.

  Returns `r` unchanged, or `r` with `optim.schedule.warmup_steps` set to the previous run's
  warmup in steps (in its parsed `optim`, its optimizer and its config, which config.json
  records).
  """
  sched = r.optim.schedule
  # A record may predate any key: a missing section is the run of an older jaxdl, not an error.
  old_sched = ((previous or {}).get("optim") or {}).get("schedule") or {}
  if (previous is None or sched.name != "wsd" or old_sched.get("name") != "wsd" or
      sched.warmup_steps is not None or previous["train"]["steps"] == r.train.steps):
    return r
  warmup = joptim.resolve_warmup(old_sched, previous["train"]["steps"])
  config = r.config.copy_and_resolve_references()
  config.optim.schedule.warmup_steps = warmup
  log.info("optim.schedule.warmup_steps pinned to %d, the warmup of the run being extended",
           warmup)
  optim = dataclasses.replace(r.optim, schedule=dataclasses.replace(sched, warmup_steps=warmup))
  return r.with_optim(optim, config)


def check_run_length(previous: dict | None, r: Run, start: int) -> None:
  """A resumed run must keep every learning rate already taken (extending WSD yes, cosine no)."""
  if previous is None or start == 0:
    return
  problem = joptim.extension_problem(previous, (r.optim, r.train.steps), start)
  if problem is not None:
    raise WorkdirMismatchError(problem)
