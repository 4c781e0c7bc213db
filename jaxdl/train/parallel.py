"""Data-parallel strategies: `jit` over a device mesh (default) and `pmap`.

Both run the same per-step maths; they differ in where the batch axis lives:
  jit:  one program over a `Mesh(devices, ('data',))`; the state is replicated with
        `NamedSharding(mesh, P())`, the batch split with `NamedSharding(mesh, P('data'))`; XLA
        inserts the gradient all-reduce and BatchNorm statistics are global automatically.
  pmap: one program per device over `axis_name='batch'`; gradients and metrics are averaged with
        `lax.pmean`, BatchNorm statistics through the model's `bn_axis_name`; the state carries a
        leading device axis while training and is saved without it.

Checkpoints always hold the single-copy (un-replicated) state, so a run can resume on another
device count or strategy.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

PMAP_AXIS = "batch"


def host_buffers(state):
  """`state` with each leaf replicated over several CPU devices of this one process replaced by
  its first device's buffer (the same array, no copy); anything else as it is.

  orbax saves a replicated array in parallel over its replicas, each writing a slice, which on
  a CPU is a small compiled program per leaf and device, all copying within the one host
  memory: about a second in each process that saves 33 such leaves (edm_digits:smoke's process
  on 4 devices: 17.1-18.4 s wall against 19.6-20.2). Restores take the shardings of the abstract
  state, so the checkpoint reads the same. Other backends and multi-process runs keep orbax's
  own choice (replicas on several accelerators or hosts write side by side)."""
  if jax.process_count() > 1:
    return state

  def one(x):
    if (isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
        and x.is_fully_replicated and all(d.platform == "cpu" for d in x.sharding.device_set)):
      return x.addressable_shards[0].data
    return x

  return jax.tree.map(one, state)


class JitStrategy:
  """`jit` with the state replicated and the batch sharded over a `data` mesh axis."""
  name = "jit"
  axis_name = None
  model_overrides: dict = {}

  def __init__(self, devices=None):
    self.devices = list(devices if devices is not None else jax.devices())
    self.mesh = Mesh(np.array(self.devices), ("data",))
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P("data"))

  @property
  def num_global_devices(self) -> int:
    return len(self.devices)

  @property
  def batch_shards(self) -> int:
    """How many parts the global batch is split into (devices that see different rows)."""
    return len(self.devices)

  def describe(self) -> dict:
    return {"strategy": self.name, "mesh": dict(self.mesh.shape), "devices": len(self.devices)}

  def state_shardings(self, state) -> Any:
    return jax.tree.map(lambda _: self.replicated, state)

  def place_state(self, state):
    """Puts a host or single-device state onto the mesh, replicated."""
    return jax.device_put(state, self.state_shardings(state))

  def shard_batch(self, local_batch: dict) -> dict:
    """Assembles this process's rows into one global array sharded over `data`."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
            for k, v in local_batch.items()}

  def compile_train(self, train_step: Callable, state,
                    compiler_options: dict | None = None) -> Callable:
    """`train_step` jitted over the mesh, the state donated; `compiler_options`: XLA's, for
    every compile of it (`jaxdl.train.accumulation.compiler_options`)."""
    shardings = self.state_shardings(state)
    return jax.jit(train_step, in_shardings=(shardings, self.batch_sharding),
                   out_shardings=(shardings, self.replicated), donate_argnums=0,
                   compiler_options=compiler_options)

  def compile_eval(self, eval_step: Callable, state) -> Callable:
    return jax.jit(eval_step, in_shardings=(self.state_shardings(state), self.batch_sharding),
                   out_shardings=self.replicated)

  def single_copy(self, state):
    """The state as saved: already one logical copy under jit (`host_buffers` on a CPU)."""
    return host_buffers(state)

  def first(self, metrics):
    return metrics


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
