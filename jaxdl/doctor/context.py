"""The doctor's view of an experiment: the run's own pieces, built as `jaxdl.train.run` builds them.

Same data stream, init key and base key (`split(PRNGKey(seed))`), model cloned with the precision
policy's compute dtype, optimizer and schedule; K is the number of classes (V for a language
model, 2 for a binary head), None for tasks without such a head.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdl.train import build
from jaxdl.train.step import step_rngs


@dataclasses.dataclass
class Context:
  config: Any
  ds: Any
  task: Any
  model: Any
  tx: Any
  schedule: Any
  policy: Any
  base_key: jax.Array
  state: Any                # the initial TrainState (step 0)
  batches: list             # the first S batches of the training stream (host arrays)
  eval_batch: dict | None
  num_classes: int | None   # K (V for an LM); None when the task has no such head
  grad_accum: int = 1       # train.grad_accum: the experiment's batches are split this way
  optim: Any = None         # the run's parsed `optim` section (`Run.optim`)
  cache: dict = dataclasses.field(default_factory=dict)

  @property
  def ln_k(self) -> float | None:
    return math.log(self.num_classes) if self.num_classes else None


def prepare(config, steps: int = 20) -> Context:
  r = build(config)
  ds, task = r.ds, r.task
  it = ds.train_iter()
  batches = [next(it) for _ in range(max(steps, 1))]
  state = r.init_state()
  # One held-out batch of up to 512 rows, whatever data.eval_batch_size says.
  eval_batch = next(iter(ds.eval_batches(batch_size=min(512, ds.info["num_eval"]))), None)
  info = ds.info
  k = task.kind.head_classes(info)
  return Context(config, ds, task, r.model, r.tx, r.schedule, r.policy, r.base_key, state,
                 batches, eval_batch, k, r.train.grad_accum, r.optim)


def loss(ctx, params, model_state, batch, train: bool, step: int = 0, apply_fn=None):
  rngs = step_rngs(ctx.base_key, jnp.asarray(step))
  return ctx.task.loss_fn(apply_fn or ctx.model.apply, params, model_state, batch, rngs, train)
