"""Few-step students of a trained flow run, from its config: reflow and step distillation.

The teacher is a trained 'flow_matching' run (model, variables) whose config also holds a
`reflow` or `distill` section. The students start from the teacher's parameters and train
outside the engine (`jaxdl.generative.reflow`, `jaxdl.generative.distill`), keyed by
`config.seed + 1`; a class-conditional teacher (gen.num_classes K > 0) draws its couplings for
the uniform labels y = i mod K, guided by gen.guidance, so the students learn the guided map and
sample unguided (`unguided`).

- `reflow_student(config, model, variables)`: the reflowed parameters and losses;
- `distill_students(config, model, variables)`: one distilled student per step count;
- `save_student`: a student as a run of its own, which `jaxdl sample` reads;
- `toy2d_reflow(config, workdir)` / `toy2d_distill(config, workdir)`: reflow_toy2d's and
  distill_toy2d's post-training procedures: the teacher is the run in `workdir`; teacher and
  students sampled with Euler at a few steps and compared with fresh target points (energy
  distance over the two-draw floor, `evaluation.evaluate_toy2d`); writes reflow.json /
  distill.json and the students in <workdir>/student (reflow) or <workdir>/student<n>.
The digits versions, judged by a classifier run, are `jaxdl.course.few_step_digits`.

Shapes: N pairs or trajectories.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from jaxdl.generative import distill, evaluation, reflow
from jaxdl.generative.settings import parse_gen


def unguided(config):
  """`config` for a student that learned the guided teacher: sampled with no guidance (one
  network call per step, where the guided teacher makes two)."""
  config = config.copy_and_resolve_references()
  config.gen.guidance = None
  return config


def _teacher_draws(config, num: int) -> dict:
  """The labels and guidance of `num` teacher draws: y = i mod K for a class-conditional run
  (K = gen.num_classes), nothing for an unconditional one."""
  k = parse_gen(config).num_classes
  if not k:
    return {"sample_shape": tuple(config.gen.sample_shape)}
  return {"sample_shape": tuple(config.gen.sample_shape), "y_N": np.arange(num) % k,
          "guidance": config.gen.guidance, "num_classes": k}


def reflow_student(config, model, variables):
  """(params, losses_steps): the teacher `variables` reflowed by `config.reflow`: its ODE takes
  `reflow.pairs` noise draws to x1, and the student fine-tunes on the coupled pairs."""
  settings = reflow.parse_reflow(config)
  key_pairs, key_train = jax.random.split(jax.random.PRNGKey(config.seed + 1))
  draws = _teacher_draws(config, settings.pairs)
  eps_N, x1_N = reflow.make_pairs(model.apply, variables, key_pairs, settings.pairs,
                                  steps=settings.teacher_steps, sampler=settings.teacher_sampler,
                                  **draws)
  tx = reflow.student_optimizer(config, settings.lr, settings.steps)
  return reflow.train_reflow(model.apply, variables["params"], tx, eps_N, x1_N,
                             steps=settings.steps, batch=settings.batch, rng=key_train,
                             y_N=draws.get("y_N"))


def distill_students(config, model, variables, student_steps=None) -> dict:
  """{n: (params, losses_steps)}: one student per n in `student_steps` (default
  `distill.student_steps`), each fine-tuned from the teacher on its chords of the teacher's
  `distill.trajectories` ODE trajectories."""
  settings = distill.parse_distill(config)
  key_traj, key_train = jax.random.split(jax.random.PRNGKey(config.seed + 1))
  draws = _teacher_draws(config, settings.trajectories)
  traj = distill.make_trajectories(model.apply, variables, key_traj, settings.trajectories,
                                   grid=settings.grid, substeps=settings.substeps, **draws)
  tx = reflow.student_optimizer(config, settings.lr, settings.steps)
  return {n: distill.train_distill(model.apply, variables["params"], tx, traj,
                                   steps=settings.steps, student_steps=n, batch=settings.batch,
                                   rng=key_train, y_N=draws.get("y_N"))
          for n in (student_steps or settings.student_steps)}


def save_student(directory, config, params, *, step: int, steps: int) -> pathlib.Path:
  """`params` as a run of its own in `directory` (Euler at `steps` steps by default), unless
  one is there: a rerun over a finished workdir keeps the first students."""
  directory = pathlib.Path(directory)
  if not directory.exists():
    evaluation.save_run(directory, config, params, step=step, sampler="euler", steps=steps)
  return directory


def loss_ends(losses) -> dict:
  """The first and last of a student's losses."""
  return {"first": float(losses[0]), "last": float(losses[-1])}


def _toy_repeats(config) -> int:
  """Rounds of fresh target draws per measurement: 8, or 2 for the smoke config."""
  return 2 if config.smoke else 8


def toy2d_reflow(config, workdir, summary=None) -> dict:
  """reflow_toy2d's procedure: reflows the run in `workdir` and measures teacher and student
  with Euler at `reflow.eval_steps` (samples.png: the student's); writes reflow.json and
  <workdir>/student (Euler, 1 step). Returns {'reflow': teacher / reflowed ratios, floor}."""
  from jaxdl.train import load_run
  del summary
  settings = reflow.parse_reflow(config)
  _, model, variables, _ = load_run(workdir, config)
  params, losses = reflow_student(config, model, variables)
  num = parse_gen(config).eval_num
  out = {}
  for name, v, fig in (("teacher", variables, None), ("reflowed", {"params": params}, workdir)):
    res = evaluation.evaluate_toy2d(config, model, v, ("euler",), settings.eval_steps, num, 0,
                                    pathlib.Path(fig) if fig else None,
                                    repeats=_toy_repeats(config))
    out[name] = {k: {"energy_ratio": r["energy_ratio"], "energy": r["energy"]}
                 for k, r in res["results"].items()}
    out["floor"] = res["floor"]["energy"]
  out["reflow_loss"] = loss_ends(losses)
  save_student(pathlib.Path(workdir) / "student", config, params, step=settings.steps, steps=1)
  pathlib.Path(workdir, "reflow.json").write_text(json.dumps(out, indent=2))
  return {"reflow": {k: out[k] for k in ("teacher", "reflowed", "floor")}}


def toy2d_distill(config, workdir, summary=None) -> dict:
  """distill_toy2d's procedure: distills the run in `workdir` into one student per
  `distill.student_steps` n and measures teacher and student with Euler at n steps; writes
  distill.json and <workdir>/student<n>. Returns {'distill': teacher / distilled ratios, floor}."""
  from jaxdl.train import load_run
  del summary
  _, model, variables, _ = load_run(workdir, config)
  num = parse_gen(config).eval_num

  def measure(v, n):
    res = evaluation.evaluate_toy2d(config, model, v, ("euler",), (n,), num, 0, None,
                                    repeats=_toy_repeats(config))
    return res["results"][f"euler@{n}"]["energy_ratio"], res["floor"]["energy"]

  out = {"teacher": {}, "distilled": {}, "loss": {}}
  for n, (params, losses) in distill_students(config, model, variables).items():
    out["teacher"][f"euler@{n}"], out["floor"] = measure(variables, n)
    out["distilled"][f"euler@{n}"], _ = measure({"params": params}, n)
    out["loss"][f"euler@{n}"] = loss_ends(losses)
    save_student(pathlib.Path(workdir) / f"student{n}", config, params,
                 step=distill.parse_distill(config).steps, steps=n)
  pathlib.Path(workdir, "distill.json").write_text(json.dumps(out, indent=2))
  return {"distill": {k: out[k] for k in ("teacher", "distilled", "floor")}}
