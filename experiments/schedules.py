"""Learning-rate schedules: step decay, cosine, warmup + cosine; cosine vs WSD extended by 50%.

Run:
  jaxdl train experiments/schedules.py            # workdir runs/schedules
  jaxdl train schedules:smoke                     # T = 100

Setup: eta0 = 0.1 over T = 1000 steps: step decay (gamma 0.5 every 0.3 T), cosine annealing,
10% linear warmup + cosine to 0. Extension: warmup-cosine (final 10%) and WSD (warmup 100 steps,
linear decay over the last 20% to 10%), planned for T, restored at 0.7 T (WSD's stable phase)
and continued with T' = 1.5 T.

Expected: step decay 0.1, 0.05, 0.025, 0.0125 on [0, 300), [300, 600), [600, 900), [900, T);
cosine 0.05 at T/2; warmup + cosine 0.1 at 0.1 T. Extension: WSD replays every lr already
taken exactly (max difference 0, extension_check True) and only moves its decay to the end of
the longer run; cosine changes every lr after its warmup (extension_check False), so a resumed
cosine run would have been trained on a schedule it no longer follows. Writes schedules.png
and results.json.
"""

import json
import os

import ml_collections
import numpy as np

from jaxdl.optim import default_optim_config, extension_check, first_changed_step, make_schedule
from jaxdl.config import parse_arg


def _sched(name, **kw):
  return default_optim_config(lr=0.1, schedule=name, **{"warmup_frac": 0.0, **kw})


def get_config(arg=None):
  smoke = parse_arg(arg, smoke=False).smoke
  c = ml_collections.ConfigDict(dict(
      name="schedules", seed=0, smoke=smoke, total_steps=100 if smoke else 1000,
      description="Step decay, cosine, warmup+cosine; cosine vs WSD when a run is extended by 50%"))
  c.extend_factor = 1.5
  c.restore_frac = 0.7
  c.step = _sched("step", step_every_frac=0.3, gamma=0.5)
  c.cosine = _sched("cosine")
  c.warmup_cosine = _sched("warmup_cosine", warmup_frac=0.1, final_frac=0.0)
  w = c.total_steps // 10
  c.ext_cosine = _sched("warmup_cosine", warmup_steps=w, final_frac=0.1)
  c.ext_wsd = _sched("wsd", warmup_steps=w, decay_frac=0.2, final_frac=0.1, decay_shape="linear")
  return c


def _full(optim_cfg, steps):
  return ml_collections.ConfigDict({"optim": optim_cfg.to_dict(), "train": {"steps": steps}})


def run(config, workdir):
  """Evaluates the schedules through the public API and checks run extension."""
  T = config.total_steps
  T2 = int(round(config.extend_factor * T))
  t = np.arange(T)
  curves = {k: np.asarray(make_schedule(config[k], T)(t)) for k in ("step", "cosine",
                                                                    "warmup_cosine")}
  results = {"lr": {k: {str(s): float(v[s]) for s in (0, T // 10, int(0.3 * T), T // 2,
                                                      int(0.6 * T), T - 1)}
                    for k, v in curves.items()}}
  restored = int(config.restore_frac * T)
  t2 = np.arange(T2)
  ext = {}
  for k in ("ext_cosine", "ext_wsd"):
    old, new = _full(config[k], T), _full(config[k], T2)
    lr_old = np.asarray(make_schedule(config[k], T)(t2))
    lr_new = np.asarray(make_schedule(config[k], T2)(t2))
    ext[k] = {"extension_ok": bool(extension_check(old, new, restored)),
              "first_changed_step": first_changed_step(old, new, restored),
              "max_abs_diff_taken": float(np.max(np.abs(lr_old[:restored] - lr_new[:restored]))),
              "lr_at_restore_old": float(lr_old[restored]),
              "lr_at_restore_new": float(lr_new[restored]),
              "curves": (lr_old, lr_new)}
  results["extension"] = {k: {kk: vv for kk, vv in v.items() if kk != "curves"}
                          for k, v in ext.items()}
  results["extension"]["restored_step"] = restored
  results["extension"]["total_old"], results["extension"]["total_new"] = T, T2
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  _plot(curves, ext, T, T2, restored, os.path.join(workdir, "schedules.png"))
  return {"step_lr_end": results["lr"]["step"][str(T - 1)],
          "cosine_lr_mid": results["lr"]["cosine"][str(T // 2)],
          "warmup_cosine_lr_peak": results["lr"]["warmup_cosine"][str(T // 10)],
          "wsd_extension_ok": ext["ext_wsd"]["extension_ok"],
          "wsd_max_abs_diff_taken": ext["ext_wsd"]["max_abs_diff_taken"],
          "cosine_extension_ok": ext["ext_cosine"]["extension_ok"],
          "cosine_max_abs_diff_taken": ext["ext_cosine"]["max_abs_diff_taken"]}


def _plot(curves, ext, T, T2, restored, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
  x = 100 * np.arange(T) / T
  for k, v in curves.items():
    a.plot(x, v, label=k)
  a.set_xlabel("step (% of T)")
  a.set_ylabel("lr")
  a.set_title("eta0 = 0.1")
  a.legend(fontsize=8)
  for (k, e), color in zip(ext.items(), ("tab:blue", "tab:green")):
    lr_old, lr_new = e["curves"]
    b.plot(np.arange(T), lr_old[:T], "--", color=color, label=f"{k[4:]} planned T={T}")
    b.plot(np.arange(T2), lr_new, "-", color=color, alpha=0.7,
           label=f"{k[4:]} extended T={T2} (replay ok: {e['extension_ok']})")
  b.axvline(restored, color="0.5", lw=0.8, label=f"restored at {restored}")
  b.set_xlabel("step")
  b.set_title("extending the run by 50%")
  b.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
