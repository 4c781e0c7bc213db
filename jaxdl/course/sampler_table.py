"""The sampler table: quality against network calls of a trained class-conditional digits run,
judged by the digits judge (`jaxdl nfe WORKDIR --steps 4,8,16,32,64`).

`sampler_table(workdir, steps_list, ...)` picks the judge and runs
`jaxdl.generative.nfe_sweep.sweep` (the procedure, the NFE accounting and the measured numbers
are in its docstring). The judge is a digits_cnn run (`jaxdl.course.digits_judge`): `judge` if
given (a classification run's workdir, used as it is), else the finished run in
<workdir>/classifier (trained by the run's class check, or copied in with its summary.json), else
one trained (or finished) there now by `digits_judge.train_judge` (digits_cnn, its `:smoke`
config when the run is a smoke run).
"""

from __future__ import annotations

import json
import pathlib

from jaxdl.course import digits_judge
from jaxdl.generative import evaluation, nfe_sweep


def judge_outputs(workdir, judge=None, smoke: bool = False):
  """(f(pixels16_Nx64) -> (probs_NxK, features_NxH), its description) of the judge (module
  docstring); `judge` may also be such an f, used as given."""
  if callable(judge):
    return judge, getattr(judge, "__name__", "given judge")
  if judge is not None:
    if not (pathlib.Path(judge) / "config.json").exists():
      raise ValueError(f"--judge {judge}: no classification run there (no config.json)")
    return evaluation.classifier_outputs(judge), f"classifier run {judge}"
  directory = pathlib.Path(workdir) / "classifier"
  if (directory / "summary.json").exists():  # finished (or copied in): used as it is
    return evaluation.classifier_outputs(directory), f"classifier run {directory}"
  # Trains the judge there, or finishes one that was stopped (the engine resumes it).
  return (evaluation.classifier_outputs(digits_judge.train_judge(workdir, smoke)),
          f"classifier run {directory} (trained now, digits_cnn{':smoke' if smoke else ''})")


def sampler_table(workdir, steps_list, *, samplers=nfe_sweep.DEFAULT_SAMPLERS, judge=None,
                  per_class: int = 100, seed: int = 0, ema: bool = True, out_dir=None,
                  log=print) -> dict:
  """`nfe_sweep.sweep` of the run in `workdir` with its judge; returns the table."""
  config_json = pathlib.Path(workdir) / "config.json"
  if not config_json.exists():
    raise ValueError(f"{workdir}: no trained run here (no config.json)")
  smoke = bool(json.loads(config_json.read_text()).get("smoke"))
  outputs, name = judge_outputs(workdir, judge, smoke)
  return nfe_sweep.sweep(workdir, steps_list, outputs, samplers=samplers, per_class=per_class,
                         seed=seed, ema=ema, out_dir=out_dir, judge_name=name, log=log)
