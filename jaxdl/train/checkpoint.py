"""Checkpoints with orbax `CheckpointManager` and the `ocp.args` API.

Each step directory holds four items:
  state     the single-copy TrainState (StandardSave; restored onto any mesh or strategy)
  data      the data iterator's state (JSON), so a resumed run sees the same batches
  config    the run's config (JSON)
  manifest  library versions, device and process counts, mesh and strategy (JSON)

Resume order (`jaxdl.train.run`): the workdir's latest readable checkpoint; if the latest is
corrupt (killed during a save, truncated file) the previous complete one, with a warning; else a
fresh start. Orbax writes each step into a temporary directory and renames it when complete, so a
save killed midway never appears as a step. All processes take part in saves.
"""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

log = logging.getLogger("jaxdl")


ITEMS = ("state", "data", "config", "manifest")


def _manager(directory, options=None) -> ocp.CheckpointManager:
  handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
              "config": ocp.JsonCheckpointHandler(), "manifest": ocp.JsonCheckpointHandler()}
  return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


class Checkpointer:
  """Saves and restores (state, data iterator state, config, manifest) per step."""

  def __init__(self, directory, *, keep: int = 3, best_metric: str = "", best_mode: str = "max",
               async_save: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    policies = [ocm.LatestN(n=keep)]
    if best_metric:
      # BestN keeps the largest values under reverse=False.
      policies.append(ocm.BestN(get_metric_fn=lambda m: m[best_metric], n=1,
                                reverse=best_mode == "min",
                                keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocm.AnyPreservationPolicy(policies),
        enable_async_checkpointing=async_save, create=True)
    self.manager = _manager(self.directory, options)

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, *, data_state: dict, config: dict, manifest: dict,
           metrics: dict | None = None, force: bool = True) -> bool:
    return self.manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                data=ocp.args.JsonSave(data_state),
                                config=ocp.args.JsonSave(config),
                                manifest=ocp.args.JsonSave(manifest)),
        metrics=metrics, force=force)

  def restore(self, abstract_state) -> tuple[int, Any, dict] | None:
    """Restores the newest readable checkpoint onto `abstract_state`'s shapes and shardings.

    Returns (step, state, data_state), or None when there is no readable checkpoint.
    """
    unreadable = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                          data=ocp.args.JsonRestore()))
        state = restored["state"]
        jax.block_until_ready(state)
      except Exception as e:  # noqa: BLE001 -- any unreadable checkpoint falls back
        log.warning("checkpoint at step %d is unreadable (%s: %s); falling back to the "
                    "previous one", step, type(e).__name__, str(e).splitlines()[0][:200])
        unreadable.append(step)
        continue
      self._quarantine(unreadable)
      return step, state, restored["data"]
    return None

  def _quarantine(self, steps: list[int]) -> None:
    """Moves unreadable steps to workdir/corrupt_checkpoints/ (kept for inspection) so the run
    can save those step numbers again."""
    if not steps:
      return
    if jax.process_index() == 0:
      dest = self.directory.parent / "corrupt_checkpoints"
      dest.mkdir(exist_ok=True)
      for step in steps:
        src = self.directory / str(step)
        if src.exists():
          src.rename(dest / f"{step}-{int(time.time())}")
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


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
