"""One named device mesh for every `jit` run: axes ('data', 'fsdp', 'expert', 'sequence',
'tensor').

Mesh: the N devices as a (N / (F X S T)) x F x X x S x T grid, F = the fsdp axis
(`parallel.fsdp` under the 'fsdp' strategy, 0 = all devices left; 1 under 'jit'), X =
`parallel.expert`, S = `parallel.sequence`, T = `parallel.tensor` (innermost, so a tensor group
is adjacent devices). An axis of size 1 is part of the mesh and splits nothing, so data
parallelism, FSDP, expert, sequence and tensor parallelism and their combinations are one class
with one set of shardings:

  batch   `NamedSharding(mesh, P(('data', 'fsdp', 'expert')))`: split over every axis but
          'sequence' and 'tensor' (every device of a sequence or tensor group sees the same rows;
          the GPT splits their positions over 'sequence' itself: `model_overrides` gives it a
          `jaxdl.models.ring_attention.SequenceSpec`, under which its activations, logits and
          attention are split along the sequence)
  state   `NamedSharding(mesh, param_spec(path, shape, mesh sizes))` per leaf, by the logical-
          name rules of `jaxdl.train.sharding_rules` (named dimensions on 'tensor' / 'expert',
          then the fsdp shape rule on 'fsdp'); with every axis but 'data' of size 1 that is P()
          for every leaf: the state replicated, plain data parallelism
  metrics replicated

XLA's SPMD partitioner inserts the collectives (the gradient all-reduce over 'data'; all-gathers
of parameters before use and reduce-scatters of gradients over 'fsdp'; the all-reduces of a row-
split matmul's partial sums over 'tensor'; moving routed tokens to their experts' devices), so
the step function is the same pure `train_step` the `pmap` strategy (`jaxdl.train.pmap`) runs,
and the numbers equal one device's up to the order of floating-point sums. Under jit BatchNorm
statistics are global automatically.

When the state is split (F, X or T > 1) the step is traced inside
`jaxdl.optim.tree_reductions.per_leaf()`: its norms and finiteness checks reduce each leaf where
it lives instead of gathering concatenations of leaves. Parameters the rules leave replicated
are listed in a log table the first time the shardings are computed, so a model that shards
badly is visible.

Checkpoints hold the logical (global) arrays, so a run restores onto another mesh or strategy:
the loop passes `state_shardings(abstract_state)` as orbax's restore target.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdl.models.ring_attention import SequenceSpec
from jaxdl.optim import tree_reductions
from jaxdl.schema import ConfigError
from jaxdl.train import sharding_rules
from jaxdl.train.sharding_rules import (DATA_AXIS, EXPERT_AXIS, FSDP_AXIS, MESH_AXES,
                                        SEQUENCE_AXIS, TENSOR_AXIS)

log = logging.getLogger("jaxdl")

BATCH_AXES = (DATA_AXIS, FSDP_AXIS, EXPERT_AXIS)  # the axes whose devices see different rows


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


def mesh_sizes(n: int, fsdp: int = 1, expert: int = 1, tensor: int = 1,
               sequence: int = 1) -> dict[str, int]:
  """The axis sizes of the mesh over `n` devices (`fsdp` 0: all devices left by the others);
  ConfigError, one line naming the setting, for a size that does not divide what is left."""
  if tensor < 1 or n % tensor:
    raise ConfigError(f"parallel.tensor: {tensor} does not divide the {n} devices; use a "
                      f"divisor of {n} (1 = no tensor parallelism)")
  if tensor > 1 and jax.process_count() > 1 and jax.local_device_count() % tensor:
    # A tensor group shares its rows; each process feeds its own, so a group must not span two.
    raise ConfigError(f"parallel.tensor: {tensor} does not divide the "
                      f"{jax.local_device_count()} devices of one process; a tensor group "
                      f"must lie within a process")
  left = f" left by parallel.tensor={tensor}" if tensor > 1 else ""
  if sequence < 1 or (n // tensor) % sequence:
    raise ConfigError(f"parallel.sequence: {sequence} does not divide the {n // tensor} devices"
                      f"{left}; use a divisor of {n // tensor} (1 = no sequence parallelism)")
  if sequence > 1 and jax.process_count() > 1 and jax.local_device_count() % (sequence * tensor):
    raise ConfigError(f"parallel.sequence: {sequence} x parallel.tensor={tensor} does not "
                      f"divide the {jax.local_device_count()} devices of one process; a "
                      f"sequence group shares its rows and must lie within a process")
  n_st = n // (sequence * tensor)
  by = [f"parallel.{k}={v}" for k, v in (("sequence", sequence), ("tensor", tensor)) if v > 1]
  left = f" left by {', '.join(by)}" if by else ""
  if expert < 1 or n_st % expert:
    raise ConfigError(f"parallel.expert: {expert} does not divide the {n_st} devices"
                      f"{left}; use a divisor of {n_st} (1 = no expert parallelism)")
  m = n_st // expert  # the ('data', 'fsdp') grid's devices
  f = fsdp or m
  if f < 1 or m % f:
    group = (" of an expert group" if expert > 1 else "") + left
    raise ConfigError(f"parallel.fsdp: {fsdp} does not divide the {m} devices{group}; use a "
                      f"divisor of {m} (0 = all devices)")
  return dict(zip(MESH_AXES, (m // f, f, expert, sequence, tensor)))


def _per_leaf(train_step: Callable) -> Callable:
  """`train_step` traced inside `tree_reductions.per_leaf()` (module docstring)."""

  @functools.wraps(train_step)
  def step(state, batch):
    with tree_reductions.per_leaf():
      return train_step(state, batch)

  return step


class MeshStrategy:
  """`jit` over the named mesh (module docstring): the 'jit' strategy (F = 1) and the 'fsdp'
  one. Its interface (place_state, shard_batch, compile_train, compile_eval, single_copy, first,
  state_shardings, describe, batch_shards) is all the loop sees, and the `pmap` strategy's too.
  """
  axis_name = None

  def __init__(self, name: str = "jit", devices=None, fsdp: int = 1, expert: int = 1,
               tensor: int = 1, sequence: int = 1, sequence_attention: str = "ring"):
    self.name = name
    self.devices = list(devices if devices is not None else jax.devices())
    sizes = mesh_sizes(len(self.devices), fsdp, expert, tensor, sequence)
    self.mesh = Mesh(np.array(self.devices).reshape(tuple(sizes.values())), MESH_AXES)
    self.fsdp_size, self.expert_size, self.tensor_size = (sizes[FSDP_AXIS], sizes[EXPERT_AXIS],
                                                           sizes[TENSOR_AXIS])
    self.sequence_size = sizes[SEQUENCE_AXIS]
    # The model's runtime fields this strategy sets (`assembly.apply_precision`).
    self.model_overrides = {}
    if self.sequence_size > 1:
      self.model_overrides["sequence"] = SequenceSpec(
          self.mesh, BATCH_AXES, SEQUENCE_AXIS, TENSOR_AXIS if self.tensor_size > 1 else None,
          sequence_attention)
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P(BATCH_AXES))
    self._reported = False

  @property
  def axis_sizes(self) -> dict[str, int]:
    return dict(self.mesh.shape)

  @property
  def splits_state(self) -> bool:
    """Whether any leaf may be split (an fsdp, expert or tensor axis of > 1 devices)."""
    return max(self.fsdp_size, self.expert_size, self.tensor_size) > 1

  @property
  def num_global_devices(self) -> int:
    return len(self.devices)

  @property
  def batch_shards(self) -> int:
    """How many parts the global batch is split into: all devices but the copies of a sequence
    and tensor group."""
    return len(self.devices) // (self.tensor_size * self.sequence_size)

  def describe(self) -> dict:
    """The manifest's record: the axes of > 1 device ('data' always)."""
    mesh = {k: n for k, n in self.axis_sizes.items() if n > 1 or k == DATA_AXIS}
    return {"strategy": self.name, "mesh": mesh, "devices": len(self.devices)}

  def state_shardings(self, state) -> Any:
    """NamedSharding per leaf by the rules table; logs the replicated parameters once."""
    if not self._reported:
      self._reported = True
      self.report(state)
    sizes = self.axis_sizes
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(self.mesh, sharding_rules.param_spec(
            path, np.shape(x), sizes)), state)

  def place_state(self, state):
    """Puts a host or single-device state onto the mesh by `state_shardings`."""
    return jax.device_put(state, self.state_shardings(state))

  def shard_batch(self, local_batch: dict) -> dict:
    """Assembles this process's rows into one global array split over `BATCH_AXES`."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
            for k, v in local_batch.items()}

  def compile_train(self, train_step: Callable, state,
                    compiler_options: dict | None = None) -> Callable:
    """`train_step` jitted over the mesh, the state donated; `compiler_options`: XLA's, for
    every compile of it (`jaxdl.train.accumulation.compiler_options`). A split state's step is
    traced inside `tree_reductions.per_leaf()` (module docstring)."""
    step = _per_leaf(train_step) if self.splits_state else train_step
    shardings = self.state_shardings(state)
    return jax.jit(step, in_shardings=(shardings, self.batch_sharding),
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

  def replicated_params(self, state) -> list[tuple[str, tuple]]:
    """Parameters that the rules leave whole on every device."""
    params = getattr(state, "params", state)
    return [(path, shape) for path, shape, spec in
            sharding_rules.sharding_table(params, self.axis_sizes) if spec == str(P())]

  def report(self, state) -> None:
    if self.tensor_size > 1:
      params = getattr(state, "params", state)
      split = sharding_rules.tensor_split_params(params, self.tensor_size)
      log.info("tensor: %d of %d parameters split over %d devices", len(split),
               len(jax.tree.leaves(params)), self.tensor_size)
    for path, shape, axis in sharding_rules.unsplit_named(state, self.axis_sizes):
      log.info("%s: %s %s is not divisible by its %d devices: kept whole along that dimension",
               axis, path, shape, self.axis_sizes[axis])
    if self.fsdp_size == 1:
      return
    rows = self.replicated_params(state)
    if not rows:
      log.info("fsdp: every parameter sharded over %d devices", self.fsdp_size)
      return
    width = max(len(p) for p, _ in rows)
    lines = [f"fsdp: {len(rows)} parameter(s) with no dimension divisible by {self.fsdp_size} "
             f"are replicated:", f"  {'parameter':<{width}}  shape"]
    lines += [f"  {p:<{width}}  {s}" for p, s in rows]
    log.info("\n".join(lines))
