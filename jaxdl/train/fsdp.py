"""Fully sharded data parallelism: `jit` over a ('data', 'fsdp') mesh with the state sharded.

Mesh: the N devices as a (N / F) x F grid, axes ('data', 'fsdp'). The batch is split over both
axes (every device sees different rows, as in data parallelism); parameters and optimizer state
are split over 'fsdp' only, replicated over 'data'. XLA's SPMD partitioner inserts the
all-gathers of parameters before use and the reduce-scatters of gradients, so the step function
is the same pure `train_step` the other strategies run and the numbers equal data parallelism's
up to the order of floating-point sums.

Shape rule (no model annotations needed): a leaf of shape (n_1, ..., n_k) is split over 'fsdp'
along its largest dimension n_i with n_i % F == 0 (the first such one on ties). A leaf with no
such dimension (scalars, a bias of odd width) is replicated; replicated parameters are listed in
a log table the first time the shardings are computed, so a model that shards badly is visible.

Expert parallelism (`parallel.expert` = X > 1): a third mesh axis 'expert', grid
(N / (F X), F, X); the batch is split over all three axes, and a mixture of experts' weights
(`jaxdl.models.moe`: leaves named 'expert_*', their expert axis third from last) are split over
'expert' along that axis, each device holding E / X experts; their other dimensions follow the
fsdp rule. XLA moves the routed tokens to the devices of their experts. The `jit` strategy with
X > 1 is this strategy with F = 1 (everything else replicated).

Checkpoints hold the logical (global) arrays, so a run restores onto another mesh or strategy:
the loop passes `state_shardings(abstract_state)` as orbax's restore target.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdl.train.parallel import JitStrategy

log = logging.getLogger("jaxdl")

FSDP_AXIS = "fsdp"
DATA_AXIS = "data"
EXPERT_AXIS = "expert"


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
  """`fsdp_spec`, except that an expert weight ('expert_' in its path) is split over 'expert'
  along its expert axis (third from last) and by the fsdp rule along the others."""
  if expert_size == 1 or "expert_" not in path or len(shape) < 3:
    return fsdp_spec(shape, fsdp_size)
  ax = len(shape) - 3
  rest = fsdp_spec(tuple(1 if i == ax else n for i, n in enumerate(shape)), fsdp_size)
  spec = list(rest) + [None] * (len(shape) - len(rest))
  spec[ax] = EXPERT_AXIS
  return P(*spec)


def sharding_table(state, fsdp_size: int) -> list[tuple[str, tuple, str]]:
  """(path, shape, spec) for every leaf of `state`, by the shape rule."""
  rows = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    shape = tuple(np.shape(leaf))
    rows.append((jax.tree_util.keystr(path), shape, str(fsdp_spec(shape, fsdp_size))))
  return rows


class FsdpStrategy(JitStrategy):
  """`jit` over Mesh((N/F, F), ('data', 'fsdp')): batch over both axes, state over 'fsdp'.

  Placement, batch assembly, compilation and checkpoint copies are the `jit` strategy's; only the
  mesh and the state shardings differ.
  """
  name = "fsdp"

  def __init__(self, devices=None, fsdp: int = 0,  # pylint: disable=super-init-not-called
               expert: int = 1):
    self.devices = list(devices if devices is not None else jax.devices())
    n = len(self.devices)
    if expert < 1 or n % expert:
      raise ValueError(f"parallel.expert: {expert} does not divide the {n} devices; use a "
                       f"divisor of {n} (1 = no expert parallelism)")
    self.expert_size = expert
    m = n // expert  # the devices of one expert group
    self.fsdp_size = fsdp or m
    if self.fsdp_size < 1 or m % self.fsdp_size:
      group = " of an expert group" if expert > 1 else ""
      raise ValueError(f"parallel.fsdp: {fsdp} does not divide the {m} devices{group}; use a "
                       f"divisor of {m} (0 = all devices)")
    axes, sizes = (DATA_AXIS, FSDP_AXIS), (n // (self.fsdp_size * expert), self.fsdp_size)
    if expert > 1:
      axes, sizes = axes + (EXPERT_AXIS,), sizes + (expert,)
    self.mesh = Mesh(np.array(self.devices).reshape(sizes), axes)
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P(axes))
    self._reported = False

  def state_shardings(self, state) -> Any:
    """NamedSharding per leaf by the shape rule; logs the replicated parameters once."""
    if not self._reported:
      self._reported = True
      self.report(state)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(self.mesh, expert_spec(
            jax.tree_util.keystr(path), np.shape(x), self.fsdp_size, self.expert_size)), state)

  def replicated_params(self, state) -> list[tuple[str, tuple]]:
    """Parameters that the shape rule leaves whole on every device."""
    params = getattr(state, "params", state)
    return [(path, shape) for path, shape, spec in sharding_table(params, self.fsdp_size)
            if spec == str(P())]

  def report(self, state) -> None:
    rows = self.replicated_params(state)
    if not rows:
      log.info("fsdp: every parameter sharded over %d devices", self.fsdp_size)
      return
    width = max(len(p) for p, _ in rows)
    lines = [f"fsdp: {len(rows)} parameter(s) with no dimension divisible by {self.fsdp_size} "
             f"are replicated:", f"  {'parameter':<{width}}  shape"]
    lines += [f"  {p:<{width}}  {s}" for p, s in rows]
    log.info("\n".join(lines))


class ExpertJitStrategy(FsdpStrategy):
  """The `jit` strategy with an expert axis of X > 1: ('data', 'fsdp', 'expert') with F = 1, so
  only the expert weights are split (over 'expert') and everything else is replicated."""
  name = "jit"

  def __init__(self, devices=None, expert: int = 2):
    super().__init__(devices, 1, expert)
