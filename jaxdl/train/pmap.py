"""The `pmap` strategy: one program per local device with `axis_name='batch'` collectives.

The thin alternative to the named mesh (`jaxdl.train.mesh`) for pmap-style code: the same
per-device `train_step`, which averages gradients and metrics with `lax.pmean` (weighted by
`Task.loss_weight` where a loss divides by what it scores) and BatchNorm statistics through the
model's `bn_axis_name`. The state carries a leading device axis while training and is saved
without it (`single_copy`), so checkpoints are the same single copy as jit's and a run resumes
under either strategy. JAX builds pmap on `shard_map`; tests/test_parallel.py proves it equal to
jit and to one device.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

PMAP_AXIS = "batch"


class PmapStrategy:
  """`pmap` over the local devices with `axis_name='batch'` collectives."""
  name = "pmap"
  axis_name = PMAP_AXIS
  model_overrides = {"bn_axis_name": PMAP_AXIS}

  def __init__(self, devices=None):
    self.devices = list(devices if devices is not None else jax.local_devices())

  @property
  def num_global_devices(self) -> int:
    return len(self.devices) * jax.process_count()

  @property
  def batch_shards(self) -> int:
    return self.num_global_devices

  def describe(self) -> dict:
    return {"strategy": self.name, "mesh": {PMAP_AXIS: len(self.devices)},
            "devices": len(self.devices)}

  def state_shardings(self, state) -> Any:
    """Where the single copy lives (created or restored) before `place_state` stacks it."""
    return jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(self.devices[0]), state)

  def place_state(self, state):
    """One copy per device along a leading axis (what `jax.device_put_replicated` used to do)."""
    n = len(self.devices)
    sharding = NamedSharding(Mesh(np.array(self.devices), (PMAP_AXIS,)), P(PMAP_AXIS))
    stacked = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n, *np.shape(x))), state)
    return jax.device_put(stacked, sharding)

  def shard_batch(self, local_batch: dict) -> dict:
    n = len(self.devices)
    return {k: np.asarray(v).reshape(n, -1, *np.shape(v)[1:]) for k, v in local_batch.items()}

  def compile_train(self, train_step: Callable, state,
                    compiler_options: dict | None = None) -> Callable:
    """`train_step` pmapped, the state donated. `jax.pmap` takes no compiler options, so
    `compiler_options` goes unused: the step compiles with XLA's defaults (a microbatch loop
    keeps its hoisted values, more memory, the same numbers)."""
    del state, compiler_options
    return jax.pmap(train_step, axis_name=PMAP_AXIS, devices=self.devices, donate_argnums=0)

  def compile_eval(self, eval_step: Callable, state) -> Callable:
    del state
    return jax.pmap(eval_step, axis_name=PMAP_AXIS, devices=self.devices)

  def single_copy(self, state):
    return jax.tree.map(lambda x: x[0], state)

  def first(self, metrics):
    return jax.tree.map(lambda x: x[0], metrics)
