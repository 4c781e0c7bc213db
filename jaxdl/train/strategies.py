"""`make_strategy(name, devices, fsdp, expert, tensor)`: the parallel strategy a run trains under.

  jit   one program over a `data` mesh axis, state replicated (`jaxdl.train.parallel`)
  pmap  one program per device with `axis_name` collectives (`jaxdl.train.parallel`)
  fsdp  jit over a ('data', 'fsdp') mesh, state sharded over 'fsdp' (`jaxdl.train.fsdp`)
With `expert` = X > 1 or `tensor` = T > 1 (jit or fsdp) the mesh gains an 'expert' axis that
splits a mixture of experts' weights by expert, and a 'tensor' axis that splits attention heads,
the MLP hidden width and the vocabulary (`jaxdl.train.fsdp`, by the one rules table of
`jaxdl.train.sharding_rules`).

Every strategy has the same interface (place_state, shard_batch, compile_train, compile_eval,
single_copy, first, state_shardings, describe, batch_shards), which is all the loop sees.
"""

from __future__ import annotations

import jax

from jaxdl.schema import ConfigError
from jaxdl.train.fsdp import FsdpStrategy, ModelParallelJitStrategy
from jaxdl.train.parallel import JitStrategy, PmapStrategy
from jaxdl.train.sharding_rules import check_layout, check_tensor

STRATEGIES = {"jit": JitStrategy, "pmap": PmapStrategy, "fsdp": FsdpStrategy}

__all__ = ["STRATEGIES", "check_batch", "check_experts", "check_layout", "check_tensor",
           "make_strategy"]


def check_batch(global_batch: int, num_devices: int, tensor: int = 1) -> None:
  """Refuses a global batch that the `num_devices / tensor` batch shards do not split evenly
  (the devices of a tensor group share their rows)."""
  shards = num_devices // tensor
  if global_batch % shards:
    over = (f"{shards} data-parallel shards ({num_devices} devices / parallel.tensor {tensor})"
            if tensor > 1 else f"{num_devices} devices")
    raise ValueError(f"data.batch_size: {global_batch} does not divide evenly over {over}; "
                     f"use a multiple of {shards}")


def check_experts(model, expert: int) -> None:
  """Refuses an expert axis of X > 1 that the model's experts E do not fill evenly (a model
  without a `moe_experts` field has none)."""
  experts = getattr(model, "moe_experts", None)
  if expert > 1 and (not experts or experts % expert):
    raise ValueError(f"parallel.expert: {expert} devices on the expert axis need a model whose "
                     f"moe_experts is a multiple of {expert}, got moe_experts={experts}")


def make_strategy(name: str, num_devices: int = 0, fsdp: int = 0, expert: int = 1,
                  tensor: int = 1):
  """The strategy over the first `num_devices` devices (0 = all of them); `fsdp` is the size of
  the fsdp mesh axis under the 'fsdp' strategy (0 = all of them), `expert` and `tensor` those of
  the expert and tensor axes under 'jit' or 'fsdp' (1 = none)."""
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
  if tensor != 1 and name == "pmap":
    raise ConfigError("parallel.tensor: tensor parallelism runs under the 'jit' or 'fsdp' "
                      "strategy, not 'pmap'")
  if name == "fsdp":
    return FsdpStrategy(devices, fsdp, expert, tensor)
  if expert != 1 or tensor != 1:
    return ModelParallelJitStrategy(devices, expert, tensor)
  return STRATEGIES[name](devices)
