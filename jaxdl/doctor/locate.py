"""NaN/Inf locator: replay a failed run to its failing step and name the first non-finite module.

`locate_nonfinite(config, workdir, step)` takes the step of `jaxdl.train.NonFiniteLossError`
(the number of updates including the failing one, as logged in metrics.jsonl) and:

  1. restores the newest checkpoint of `workdir` at or before step - 1 with the engine's own
     pieces (`jaxdl.train.build`, the checkpoint layout of `jaxdl.train.checkpoint`), or starts
     from the seeded init when there is none;
  2. replays the updates from there with the run's strategy and compiled step. The engine is
     bit-exact on resume (same batches from the restored iterator state, randomness
     fold_in(base_key, s)), so the replay meets the same numbers; the first update whose loss
     or gradient norm is not finite is the failing one (it can be earlier than `step` when a
     non-finite gradient first poisoned the parameters and the loss followed one step later);
  3. reruns that update eagerly with flax `capture_intermediates=True`: the first module, in
     execution order, whose output holds a NaN/Inf is named, with the rows of the batch where it
     appears. When every output is finite the loss itself (e.g. log 0) or the backward pass is
     blamed, naming the parameters whose gradients are not finite.

The batch index is the 0-based position of the failing batch in the training stream, and its
epoch is position // steps_per_epoch; batches the spike guard skipped (the `skipped_batch` of
'rewind' events in metrics.jsonl) are skipped in the replay too, so position = s + skips.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxdl.doctor import probes
from jaxdl.train import build
from jaxdl.train import checkpoint as jckpt
from jaxdl.train.accumulation import compiler_options
from jaxdl.train.step import make_train_step, step_rngs
from jaxdl.train.writers import read_records


@dataclasses.dataclass
class Finding:
  """Where a run first went non-finite. `module` is None when nothing was found."""
  step: int                       # 1-based: the update that produced the non-finite loss
  batch_index: int                # 0-based position of its batch in the training stream
  epoch: int
  restored_from: int | None       # checkpoint step the replay started from (None: fresh init)
  reproduced: bool
  where: str = ""                 # 'forward' | 'loss' | 'backward' | 'params'
  module: str | None = None
  rows: list[int] = dataclasses.field(default_factory=list)
  batch_size: int = 0
  loss: float = float("nan")
  previous_module: str | None = None
  nonfinite_grads: list[str] = dataclasses.field(default_factory=list)
  nonfinite_params: list[str] = dataclasses.field(default_factory=list)

  def text(self) -> str:
    start = (f"checkpoint at step {self.restored_from}" if self.restored_from is not None
             else "the seeded init (no checkpoint)")
    head = (f"step {self.step} (batch {self.batch_index} of the training stream, epoch "
            f"{self.epoch}), replayed from {start}")
    if not self.reproduced:
      return (f"locator: the replay up to step {self.step} stayed finite, replayed from "
              f"{start}; the failure did not reproduce (non-deterministic op, or a different "
              "config/data than the failed run?)")
    if self.where == "forward":
      after = f" (its input from '{self.previous_module}' was finite)" if self.previous_module \
          else ""
      return (f"locator: first non-finite output in module '{self.module}'{after}, at {head}; "
              f"batch rows {self.rows[:8]} of {self.batch_size}; loss {self.loss}")
    if self.where == "loss":
      return (f"locator: every module output was finite, the loss was not ({self.loss}): "
              f"look at the loss (log 0, division by 0, labels) at {head}")
    if self.where == "params":
      return (f"locator: parameters were already non-finite before {head}: "
              f"{', '.join(self.nonfinite_params[:6])}")
    return (f"locator: forward finite (loss {self.loss}), non-finite gradients at {head} in "
            f"{', '.join(self.nonfinite_grads[:6])}; module '{self.module}'")


def _restore_at_most(workdir: pathlib.Path, abstract, step: int):
  """(checkpoint step, state, data state) of the newest readable checkpoint <= step, or None."""
  directory = workdir / "checkpoints"
  if not directory.exists():
    return None
  manager = ocp.CheckpointManager(directory.absolute(),
                                  item_names=("state", "data", "config", "manifest"))
  try:
    for s in sorted((s for s in manager.all_steps() if s <= step), reverse=True):
      try:
        restored = manager.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
        return s, restored["state"], restored["data"]
      except Exception:  # noqa: BLE001 -- an unreadable checkpoint: try the one before
        continue
  finally:
    manager.close()
  return None


def locate_nonfinite(config, workdir, step: int) -> Finding:
  """Replays `config`'s run in `workdir` to `step` and names the first non-finite module."""
  if step < 1:
    raise ValueError(f"step: must be >= 1 (the step of the non-finite loss), got {step}")
  workdir = pathlib.Path(workdir)
  r = build(config)
  ds, task, strategy, model = r.ds, r.task, r.strategy, r.model
  train_it = ds.train_iter(process_index=jax.process_index(), process_count=jax.process_count())
  abstract = r.abstract_state()
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  restored = _restore_at_most(workdir, jckpt.abstract_like(
      abstract, jax.tree.map(lambda _: device, abstract)), step - 1)
  if restored is None:
    start, state = 0, r.init_state()
  else:
    start, state, data_state = restored
    train_it.set_state(data_state)
  train_step = make_train_step(model.apply, task.loss_fn, r.tx, r.schedule, r.base_key,
                               axis_name=strategy.axis_name, grad_accum=r.train.grad_accum,
                               loss_weight=task.loss_weight)
  state = strategy.place_state(state)
  train_fn = strategy.compile_train(train_step, state, compiler_options(r.train.grad_accum))
  spe = ds.info["steps_per_epoch"]
  skipped = _skipped_batches(workdir)
  for s in range(start, step):
    while train_it.step in skipped:  # batches the spike guard dropped, as the loop does
      next(train_it)
    position = train_it.step
    batch = next(train_it)
    before = jax.tree.map(jnp.copy, state)  # the step donates its input state
    state, metrics = train_fn(state, strategy.shard_batch(batch))
    metrics = jax.device_get(strategy.first(metrics))
    bad = not (math.isfinite(float(metrics["loss"])) and float(metrics["state_finite"]) == 1.0)
    if not r.policy.loss_scaling:  # under fp16 loss scaling a non-finite gradient is a skipped step
      bad = bad or not math.isfinite(float(metrics["grad_norm"]))
    if bad:
      finding = Finding(s + 1, position, position // max(spe, 1),
                        None if restored is None else start, True)
      host = jax.device_get(strategy.single_copy(before))
      return _analyse(finding, model, task, host, batch, step_rngs(r.base_key, jnp.asarray(s)))
  return Finding(step, train_it.step - 1, (train_it.step - 1) // max(spe, 1),
                 None if restored is None else start, False)


def _skipped_batches(workdir: pathlib.Path) -> set[int]:
  """Data positions the spike guard skipped ('rewind' events in metrics.jsonl)."""
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return set()
  events = read_records(path)  # a torn line (crash, full disk) is skipped, not fatal
  return {int(e["skipped_batch"]) for e in events
          if e.get("event") == "rewind" and "skipped_batch" in e}


def _analyse(finding: Finding, model, task, state, batch, rngs) -> Finding:
  finding.nonfinite_params = [p for p, x in jax.tree_util.tree_leaves_with_path(state.params)
                              if not probes.is_finite(x)]
  finding.nonfinite_params = [probes.path_str(p) for p in finding.nonfinite_params]
  finding.batch_size = len(next(iter(batch.values())))
  if finding.nonfinite_params:
    finding.where = "params"
    return finding
  sink: list = []
  loss, _ = task.loss_fn(probes.capturing_apply(model, sink), state.params, state.model_state,
                         batch, rngs, True)
  finding.loss = float(loss)
  outs = probes.module_outputs(sink[0]) if sink else []
  for i, (name, x) in enumerate(outs):
    if not probes.is_finite(x):
      finding.where, finding.module = "forward", name
      finding.previous_module = outs[i - 1][0] if i > 0 else None
      ok_B = np.isfinite(np.asarray(x, np.float32)).reshape(x.shape[0], -1).all(axis=1)
      finding.rows = [int(r) for r in np.nonzero(~ok_B)[0]]
      return finding
  if not math.isfinite(finding.loss):
    finding.where = "loss"
    return finding
  grads = jax.grad(lambda p: task.loss_fn(model.apply, p, state.model_state, batch, rngs,
                                          True)[0])(state.params)
  finding.where = "backward"
  finding.nonfinite_grads = [path for path, n in probes.leaf_norms(grads) if not math.isfinite(n)]
  if finding.nonfinite_grads:
    finding.module = finding.nonfinite_grads[0].rsplit("/", 1)[0]
  return finding
