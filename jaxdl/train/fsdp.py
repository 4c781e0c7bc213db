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


def fsdp_spec(shape: tuple[int, ...], fsdp_size: int) -> P:
  """PartitionSpec splitting the largest dimension divisible by `fsdp_size`; P() if none."""
  best = None
  for i, n in enumerate(shape):
    if n % fsdp_size == 0 and n >= fsdp_size and (best is None or n > shape[best]):
      best = i
  if best is None or fsdp_size == 1:
    return P()
  return P(*[FSDP_AXIS if i == best else None for i in range(len(shape))])


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

  def __init__(self, devices=None, fsdp: int = 0):  # pylint: disable=super-init-not-called
    self.devices = list(devices if devices is not None else jax.devices())
    n = len(self.devices)
    self.fsdp_size = fsdp or n
    if self.fsdp_size < 1 or n % self.fsdp_size:
      raise ValueError(f"parallel.fsdp: {fsdp} does not divide the {n} devices; use a divisor "
                       f"of {n} (0 = all devices)")
    grid = np.array(self.devices).reshape(n // self.fsdp_size, self.fsdp_size)
    self.mesh = Mesh(grid, (DATA_AXIS, FSDP_AXIS))
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P((DATA_AXIS, FSDP_AXIS)))
    self._reported = False

  def state_shardings(self, state) -> Any:
    """NamedSharding per leaf by the shape rule; logs the replicated parameters once."""
    if not self._reported:
      self._reported = True
      self.report(state)
    return jax.tree.map(lambda x: NamedSharding(self.mesh, fsdp_spec(np.shape(x),
                                                                      self.fsdp_size)), state)

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
