"""`make_strategy(name, devices, fsdp)`: the parallel strategy a run trains under.

  jit   one program over a `data` mesh axis, state replicated (`jaxdl.train.parallel`)
  pmap  one program per device with `axis_name` collectives (`jaxdl.train.parallel`)
  fsdp  jit over a ('data', 'fsdp') mesh, state sharded over 'fsdp' (`jaxdl.train.fsdp`)
With `expert` = X > 1 (jit or fsdp) the mesh gains an 'expert' axis that splits a mixture of
experts' weights by expert (`jaxdl.train.fsdp`).

Every strategy has the same interface (place_state, shard_batch, compile_train, compile_eval,
single_copy, first, state_shardings, describe), which is all the loop sees.
"""

from __future__ import annotations

import jax

from jaxdl.train.fsdp import ExpertJitStrategy, FsdpStrategy
from jaxdl.train.parallel import JitStrategy, PmapStrategy

STRATEGIES = {"jit": JitStrategy, "pmap": PmapStrategy, "fsdp": FsdpStrategy}


def check_batch(global_batch: int, num_devices: int) -> None:
  if global_batch % num_devices:
    raise ValueError(f"data.batch_size: {global_batch} does not divide evenly over "
                     f"{num_devices} devices; use a multiple of {num_devices}")


def check_experts(model, expert: int) -> None:
  """Refuses an expert axis of X > 1 that the model's experts E do not fill evenly (a model
  without a `moe_experts` field has none)."""
  experts = getattr(model, "moe_experts", 0)
  if expert > 1 and (not experts or experts % expert):
    raise ValueError(f"parallel.expert: {expert} devices on the expert axis need a model whose "
                     f"moe_experts is a multiple of {expert}, got moe_experts={experts}")


def make_strategy(name: str, num_devices: int = 0, fsdp: int = 0, expert: int = 1):
  """The strategy over the first `num_devices` devices (0 = all of them); `fsdp` is the size of
  the fsdp mesh axis under the 'fsdp' strategy (0 = all of them), `expert` that of the expert
  axis under 'jit' or 'fsdp' (1 = none)."""
  if name not in STRATEGIES:
    raise ValueError(f"parallel.strategy: unknown strategy {name!r}; expected one of "
                     f"{sorted(STRATEGIES)}")
  devices = None
  if num_devices:
    pool = jax.devices() if name in ("jit", "fsdp") else jax.local_devices()
    if num_devices > len(pool):
      raise ValueError(f"parallel.devices: {num_devices} requested, only {len(pool)} available")
    if jax.process_count() > 1:
      raise ValueError("parallel.devices: must be 0 (all devices) in a multi-process run")
    devices = pool[:num_devices]
  if expert != 1 and name == "pmap":
    raise ValueError("parallel.expert: expert parallelism runs under the 'jit' or 'fsdp' "
                     "strategy, not 'pmap'")
  if name == "fsdp":
    return FsdpStrategy(devices, fsdp, expert)
  if expert != 1:
    return ExpertJitStrategy(devices, expert)
  return STRATEGIES[name](devices)
