"""Model-parallel mesh strategies: `jit` over ('data', 'fsdp'[, 'expert'][, 'tensor']).

Mesh: the N devices as a (N / (F X T)) x F [x X] [x T] grid, axes ('data', 'fsdp', 'expert',
'tensor'); an 'expert' axis only when X = `parallel.expert` > 1, a 'tensor' axis only when
T = `parallel.tensor` > 1 (innermost, so a tensor group is adjacent devices). The batch is split
over every axis but 'tensor' (every device of a tensor group sees the same rows); parameters and
optimizer state by `jaxdl.train.sharding_rules.param_spec`, one rules table for every axis:

  tensor  named dimensions (heads, MLP hidden, vocabulary) split over 'tensor'
  expert  a mixture of experts' weights (`jaxdl.models.moe`: 'expert_fc', 'expert_proj') split
          along their expert axis, each device holding E / X experts
  fsdp    shape rule (no model annotations needed): a leaf of shape (n_1, ..., n_k) is split
          over 'fsdp' along its largest dimension n_i with n_i % F == 0 not already split by
          name (the first such one on ties). A leaf with no such dimension (scalars, a bias of
          odd width) is replicated; replicated parameters are listed in a log table the first
          time the shardings are computed, so a model that shards badly is visible.

XLA's SPMD partitioner inserts the collectives (all-gathers of parameters before use, reduce-
scatters of gradients, the all-reduces of a row-split matmul's partial sums, moving routed tokens
to their experts' devices), so the step function is the same pure `train_step` the other
strategies run and the numbers equal data parallelism's up to the order of floating-point sums.
The `jit` strategy with X > 1 or T > 1 is this strategy with F = 1.

Checkpoints hold the logical (global) arrays, so a run restores onto another mesh or strategy:
the loop passes `state_shardings(abstract_state)` as orbax's restore target.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdl.optim import tree_reductions
from jaxdl.schema import ConfigError
from jaxdl.train import sharding_rules
from jaxdl.train.parallel import JitStrategy

log = logging.getLogger("jaxdl")

FSDP_AXIS = "fsdp"
DATA_AXIS = "data"
EXPERT_AXIS = "expert"
TENSOR_AXIS = sharding_rules.TENSOR_AXIS


def fsdp_spec(shape: tuple[int, ...], fsdp_size: int) -> P:
  """PartitionSpec splitting the largest dimension divisible by `fsdp_size`; P() if none."""
  best = None
  for i, n in enumerate(shape):
    if n % fsdp_size == 0 and n >= fsdp_size and (best is None or n > shape[best]):
      best = i
  if best is None or fsdp_size == 1:
    return P()
  return P(*[FSDP_AXIS if i == best else None for i in range(len(shape))])


def expert_spec(path: str, shape: tuple[int, ...], fsdp_size: int, expert_size: int) -> P:
  """`fsdp_spec`, except that an expert weight is split over 'expert' along its expert axis
  and by the fsdp rule along the others (`sharding_rules.param_spec` on an fsdp x expert mesh)."""
  return sharding_rules.param_spec(path, shape, {FSDP_AXIS: fsdp_size, EXPERT_AXIS: expert_size},
                                   fsdp_spec)


def sharding_table(state, sizes: dict[str, int] | int) -> list[tuple[str, tuple, str]]:
  """(path, shape, spec) for every leaf of `state` on a mesh of axis `sizes` (an int: the fsdp
  axis alone)."""
  if isinstance(sizes, int):
    sizes = {FSDP_AXIS: sizes}
  rows = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    shape = tuple(np.shape(leaf))
    rows.append((jax.tree_util.keystr(path), shape,
                 str(sharding_rules.param_spec(path, shape, sizes, fsdp_spec))))
  return rows


class FsdpStrategy(JitStrategy):
  """`jit` over Mesh((N/(F X T), F[, X][, T]), ('data', 'fsdp'[, 'expert'][, 'tensor'])): batch
  over all axes but 'tensor', state by the rules table (module docstring).

  Placement, batch assembly, compilation and checkpoint copies are the `jit` strategy's; only the
  mesh and the state shardings differ.
  """
  name = "fsdp"

  def __init__(self, devices=None, fsdp: int = 0,  # pylint: disable=super-init-not-called
               expert: int = 1, tensor: int = 1):
    self.devices = list(devices if devices is not None else jax.devices())
    n = len(self.devices)
    if tensor < 1 or n % tensor:
      raise ConfigError(f"parallel.tensor: {tensor} does not divide the {n} devices; use a "
                        f"divisor of {n} (1 = no tensor parallelism)")
    if tensor > 1 and jax.process_count() > 1 and jax.local_device_count() % tensor:
      # A tensor group shares its rows; each process feeds its own, so a group must not span two.
      raise ConfigError(f"parallel.tensor: {tensor} does not divide the "
                        f"{jax.local_device_count()} devices of one process; a tensor group "
                        f"must lie within a process")
    self.tensor_size = tensor
    if expert < 1 or (n // tensor) % expert:
      group = f" left by parallel.tensor={tensor}" if tensor > 1 else ""
      raise ValueError(f"parallel.expert: {expert} does not divide the {n // tensor} devices"
                       f"{group}; use a divisor of {n // tensor} (1 = no expert parallelism)")
    self.expert_size = expert
    m = n // (expert * tensor)  # the ('data', 'fsdp') grid's devices
    self.fsdp_size = fsdp or m
    if self.fsdp_size < 1 or m % self.fsdp_size:
      group = " of an expert group" if expert > 1 else ""
      group += f" left by parallel.tensor={tensor}" if tensor > 1 else ""
      raise ValueError(f"parallel.fsdp: {fsdp} does not divide the {m} devices{group}; use a "
                       f"divisor of {m} (0 = all devices)")
    axes, sizes = (DATA_AXIS, FSDP_AXIS), (m // self.fsdp_size, self.fsdp_size)
    if expert > 1:
      axes, sizes = axes + (EXPERT_AXIS,), sizes + (expert,)
    batch_axes = axes
    if tensor > 1:
      axes, sizes = axes + (TENSOR_AXIS,), sizes + (tensor,)
    self.mesh = Mesh(np.array(self.devices).reshape(sizes), axes)
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P(batch_axes))
    self._reported = False

  @property
  def batch_shards(self) -> int:
    """Devices with different rows: all but the tensor axis's copies."""
    return len(self.devices) // self.tensor_size

  @property
  def axis_sizes(self) -> dict[str, int]:
    return dict(self.mesh.shape)

  def state_shardings(self, state) -> Any:
    """NamedSharding per leaf by the rules table; logs the replicated parameters once."""
    if not self._reported:
      self._reported = True
      self.report(state)
    sizes = self.axis_sizes
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(self.mesh, sharding_rules.param_spec(
            path, np.shape(x), sizes, fsdp_spec)), state)

  def compile_train(self, train_step, state, compiler_options=None):
    """The jit strategy's compiled step, traced inside `tree_reductions.per_leaf()`: the state
    is split over devices, so its norms and finiteness checks reduce each leaf where it lives
    instead of gathering concatenations of leaves."""

    @functools.wraps(train_step)
    def per_leaf_step(state, batch):
      with tree_reductions.per_leaf():
        return train_step(state, batch)

    return super().compile_train(per_leaf_step, state, compiler_options)

  def replicated_params(self, state) -> list[tuple[str, tuple]]:
    """Parameters that the rules leave whole on every device."""
    params = getattr(state, "params", state)
    return [(path, shape) for path, shape, spec in sharding_table(params, self.axis_sizes)
            if spec == str(P())]

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


class ModelParallelJitStrategy(FsdpStrategy):
  """The `jit` strategy with an expert axis of X > 1 or a tensor axis of T > 1: ('data', 'fsdp'
  [, 'expert'][, 'tensor']) with F = 1, so only the named weights are split and everything else
  is replicated."""
  name = "jit"

  def __init__(self, devices=None, expert: int = 1, tensor: int = 1):
    super().__init__(devices, 1, expert, tensor)


ExpertJitStrategy = ModelParallelJitStrategy  # its name before the tensor axis
