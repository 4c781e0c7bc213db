"""Checkpoints with orbax `CheckpointManager` and the `ocp.args` API.

Each step directory holds four items:
  state     the single-copy TrainState (StandardSave; restored onto any mesh or strategy)
  data      the data iterator's state (JSON), so a resumed run sees the same batches
  config    the run's config (JSON)
  manifest  library versions, device and process counts, mesh and strategy (JSON)

and `checksums.json`, the sha256 of every file of the step, written once the save is complete
(for an async save: at the next save, `wait` or `close`), because orbax checks only the index of
its array files (crc32c), not their data: a flipped byte would otherwise load silently.

Resume order (`jaxdl.train.run`): the workdir's latest readable checkpoint whose files match their
checksums (a step without checksums yet, its save having ended before they were written, is
restored unverified, said in one line); if it is corrupt (killed during a save, a truncated file,
a flipped byte) the previous good one; else a fresh start. Corrupt steps, however many, are moved
to `workdir/corrupt_checkpoints/` with one summary line, so the run can save those steps again.
Orbax writes each step into a temporary directory and renames it when complete, so a save killed
midway never appears as a step; such a leftover directory is removed, with one line, when the
next run opens the checkpoints. All processes take part in saves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import pathlib
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

log = logging.getLogger("jaxdl")


ITEMS = ("state", "data", "config", "manifest")
CHECKSUMS = "checksums.json"
TMP_MARK = ".orbax-checkpoint-tmp"  # orbax's suffix of a step directory being written


def _digests(step_dir: pathlib.Path) -> dict[str, str]:
  """sha256 of every file of a step directory, keyed by path relative to it."""
  out = {}
  for f in sorted(step_dir.rglob("*")):
    if f.is_file() and f.name != CHECKSUMS:
      with f.open("rb") as fh:
        out[f.relative_to(step_dir).as_posix()] = hashlib.file_digest(fh, "sha256").hexdigest()
  return out


def write_checksums(step_dir) -> None:
  """Records the digests of a complete step directory (written whole, then renamed)."""
  step_dir = pathlib.Path(step_dir)
  tmp = step_dir / (CHECKSUMS + ".tmp")
  tmp.write_text(json.dumps(_digests(step_dir), indent=0))
  tmp.replace(step_dir / CHECKSUMS)


def verify_checksums(step_dir) -> str | None:
  """None when every recorded file is present with its digest, "unverified" when the step has
  no checksums, else what differs (naming the item and file)."""
  step_dir = pathlib.Path(step_dir)
  try:
    recorded = json.loads((step_dir / CHECKSUMS).read_text())
  except (OSError, ValueError):
    return "unverified"
  actual = _digests(step_dir)
  for name, digest in recorded.items():
    if name not in actual:
      return f"{name} is missing"
    if actual[name] != digest:
      return f"checksum mismatch in {name}"
  return None


def _clean_tmp(directory: pathlib.Path) -> None:
  """Removes step directories a killed save left half-written (one line for all of them)."""
  leftovers = sorted(directory.glob(f"*{TMP_MARK}*")) if directory.is_dir() else []
  if not leftovers or jax.process_index() != 0:
    return
  for path in leftovers:
    shutil.rmtree(path, ignore_errors=True)
  log.warning("removed %d unfinished checkpoint save(s) left by a killed run: %s", len(leftovers),
              ", ".join(p.name for p in leftovers))


def _manager(directory, options=None) -> ocp.CheckpointManager:
  handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
              "config": ocp.JsonCheckpointHandler(), "manifest": ocp.JsonCheckpointHandler()}
  return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


class Checkpointer:
  """Saves and restores (state, data iterator state, config, manifest) per step."""

  def __init__(self, directory, *, keep: int = 3, best_metric: str = "", best_mode: str = "max",
               async_save: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    _clean_tmp(self.directory)
    self._unsealed: list[int] = []   # saved steps whose checksums are not written yet
    policies = [ocm.LatestN(n=keep)]
    if best_metric:
      # BestN keeps the largest values under reverse=False.
      policies.append(ocm.BestN(get_metric_fn=lambda m: m[best_metric], n=1,
                                reverse=best_mode == "min",
                                keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocm.AnyPreservationPolicy(policies),
        enable_async_checkpointing=async_save, create=True)
    self.async_save = async_save
    self.manager = _manager(self.directory, options)

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, *, data_state: dict, config: dict, manifest: dict,
           metrics: dict | None = None, force: bool = True) -> bool:
    self._seal()  # orbax waits for the previous save here anyway
    saved = self.manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                data=ocp.args.JsonSave(data_state),
                                config=ocp.args.JsonSave(config),
                                manifest=ocp.args.JsonSave(manifest)),
        metrics=metrics, force=force)
    if saved:
      self._unsealed.append(step)
      if not self.async_save:
        self._seal()
    return saved

  def _seal(self) -> None:
    """Waits for pending saves, then writes their checksums (process 0; steps the preservation
    policy already deleted are skipped)."""
    self.manager.wait_until_finished()
    if jax.process_index() == 0:
      for step in self._unsealed:
        if (self.directory / str(step)).is_dir():
          write_checksums(self.directory / str(step))
    self._unsealed = []

  def restore(self, abstract_state) -> tuple[int, Any, dict] | None:
    """Restores the newest good checkpoint onto `abstract_state`'s shapes and shardings.

    Steps that fail their checksums or do not load are quarantined (one line for all of them).
    Returns (step, state, data_state), or None when no checkpoint is good.
    """
    unreadable: dict[int, str] = {}
    for step in sorted(self.manager.all_steps(), reverse=True):
      problem = verify_checksums(self.directory / str(step))
      if problem not in (None, "unverified"):
        unreadable[step] = problem
        continue
      try:
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                          data=ocp.args.JsonRestore()))
        state = restored["state"]
        jax.block_until_ready(state)
      except Exception as e:  # noqa: BLE001 -- any unreadable checkpoint falls back
        unreadable[step] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        continue
      self._quarantine(unreadable, found=step)
      if problem == "unverified":
        log.info("checkpoint at step %d has no checksums (its run ended before they were "
                 "written); restored it unverified", step)
      return step, state, restored["data"]
    self._quarantine(unreadable, found=None)
    return None

  def _quarantine(self, unreadable: dict[int, str], found: int | None) -> None:
    """Moves unreadable steps to workdir/corrupt_checkpoints/ (kept for inspection) so the run
    can save those step numbers again, and says so in one line."""
    if not unreadable:
      return
    dest = self.directory.parent / "corrupt_checkpoints"
    if jax.process_index() == 0:
      dest.mkdir(exist_ok=True)
      stamp = int(time.time())
      for step in unreadable:
        src = self.directory / str(step)
        if src.exists():
          src.rename(dest / f"{step}-{stamp}")
    steps = sorted(unreadable, reverse=True)
    first = f"step {steps[0]}: {unreadable[steps[0]]}"
    what = (f"checkpoint at step {steps[0]} is unreadable ({unreadable[steps[0]]})"
            if len(steps) == 1 else
            f"checkpoints at steps {', '.join(map(str, steps))} are unreadable ({first})")
    then = "starting fresh" if found is None else f"falling back to step {found}"
    log.warning("%s; moved to %s/, %s", what, dest, then)
    self.manager.reload()

  def wait(self) -> None:
    self._seal()

  def close(self) -> None:
    try:
      self._seal()
    finally:  # a failed save (a full disk) must still stop orbax's save threads
      self.manager.close()


def saved_steps(directory) -> list[int]:
  """The step directories in `directory`, sorted (listed only: nothing is opened or verified)."""
  directory = pathlib.Path(directory)
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit()) if directory.is_dir() else []


def latest_saved_step(directory) -> int | None:
  """The newest step directory in `directory` (listed only), or None when there is none."""
  return (saved_steps(directory) or [None])[-1]


def restorable(directory, abstract_state) -> bool:
  """Whether the latest checkpoint in `directory` holds a state of `abstract_state`'s tree,
  shapes and dtypes (read from its metadata; False when there is none or it cannot be read)."""
  directory = pathlib.Path(directory).absolute()
  if not directory.is_dir():
    return False
  manager = _manager(directory)
  try:
    step = manager.latest_step()
    if step is None:
      return False
    meta = manager.item_metadata(step)["state"]
  except Exception:  # noqa: BLE001 -- unreadable: nothing a new run could resume from
    return False
  finally:
    manager.close()

  def leaves(tree):
    return {jax.tree_util.keystr(p, simple=True, separator="/"): (tuple(x.shape), str(x.dtype))
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return leaves(meta) == leaves(abstract_state)


def abstract_like(state, shardings) -> Any:
  """ShapeDtypeStructs of `state` carrying the target shardings (for restore)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)


def load_state(workdir, step: int | None = None) -> tuple[int, dict]:
  """Reads a run's saved state as nested dicts of arrays on the first local device.

  For inspection, sampling and tests: no model or optimizer needs to be built. Returns
  (step, state) where state has the keys of `TrainState` (params, opt_state, model_state, ...).
  """
  directory = pathlib.Path(workdir).absolute() / "checkpoints"
  manager = _manager(directory)
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  meta = manager.item_metadata(step)["state"]
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
  restored = manager.restore(step,
                             args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
  manager.close()
  return step, restored["state"]


def load_params(workdir, where) -> dict:
  """The params alone of a run's latest checkpoint (not its optimizer state), each leaf read
  straight into `where(path 'a/b/c', shape) -> Sharding` (a fine-tuning run's shardings:
  `jaxdl.train.init_from`), in its saved dtype. FileNotFoundError when there is none."""
  directory = pathlib.Path(workdir).absolute() / "checkpoints"
  handlers = {"state": ocp.PyTreeCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
              "config": ocp.JsonCheckpointHandler(), "manifest": ocp.JsonCheckpointHandler()}
  manager = ocp.CheckpointManager(directory, item_handlers=handlers)
  step = manager.latest_step()
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  meta = manager.item_metadata(step)["state"]["params"]
  abstract = {"params": jax.tree_util.tree_map_with_path(
      lambda p, m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=where(
          "/".join(str(getattr(k, "key", k)) for k in p), m.shape)), meta)}
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
      partial_restore=True)))  # the params only: the optimizer state stays on disk
  manager.close()
  return restored["state"]["params"]


def load_run(workdir, config=None, *, ema: bool = True):
  """(config, model, variables, step) of a trained run of any task, from its latest checkpoint:
  the model built from the config (the run's config.json unless `config` is given) and its
  variables {'params', **model_state}, ready for `model.apply`.

  With `ema` (the default) the parameters are the run's moving average when it kept one
  (`optim.ema_decay`), else the last iterate.
  """
  import ml_collections  # pylint: disable=g-import-not-at-top
  from jaxdl import models  # pylint: disable=g-import-not-at-top
  from jaxdl.optim import find_ema  # pylint: disable=g-import-not-at-top
  workdir = pathlib.Path(workdir)
  if config is None:
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
  step, state = load_state(workdir)
  averaged = find_ema(state.get("opt_state")) if ema else None
  params = state["params"] if averaged is None else averaged
  variables = {"params": params, **(state.get("model_state") or {})}
  return config, models.build_model(config.model), variables, step


def manifest(strategy, config) -> dict:
  """What a checkpoint was written by: library versions, devices, processes, mesh, strategy."""
  versions = {name: importlib.metadata.version(dist) for name, dist in (
      ("jax", "jax"), ("flax", "flax"), ("optax", "optax"), ("orbax", "orbax-checkpoint"),
      ("grain", "grain"))}
  return {**versions,
          "backend": jax.default_backend(), "device_count": jax.device_count(),
          "local_device_count": jax.local_device_count(), "process_count": jax.process_count(),
          **strategy.describe(), "experiment": config.name}
