"""`make_strategy(name, devices, fsdp, expert, tensor)`: the parallel strategy a run trains under.

  jit   `jit` over the named mesh ('data', 'fsdp', 'expert', 'tensor') with F = 1
        (`jaxdl.train.mesh`): the state replicated unless `expert` = X > 1 or `tensor` = T > 1
        split a mixture's experts or a transformer's heads, MLP and vocabulary
        (`jaxdl.train.sharding_rules`)
  fsdp  the same mesh with F = `fsdp` (0 = all devices left): every leaf also split over 'fsdp'
  pmap  one program per device with `axis_name` collectives (`jaxdl.train.pmap`)

Every strategy has the same interface (place_state, shard_batch, compile_train, compile_eval,
single_copy, first, state_shardings, describe, batch_shards), which is all the loop sees. Every
bad `parallel.*` setting is a `ConfigError` naming it, raised before anything is built.
"""

from __future__ import annotations

import jax

from jaxdl.schema import ConfigError
from jaxdl.train.mesh import MeshStrategy
from jaxdl.train.pmap import PmapStrategy
from jaxdl.train.sharding_rules import check_layout, check_tensor

STRATEGIES = ("fsdp", "jit", "pmap")

__all__ = ["STRATEGIES", "check_batch", "check_experts", "check_layout", "check_tensor",
           "make_strategy"]


def check_batch(global_batch: int, num_devices: int, tensor: int = 1) -> None:
  """Refuses a global batch that the `num_devices / tensor` batch shards do not split evenly
  (the devices of a tensor group share their rows)."""
  shards = num_devices // tensor
  if global_batch % shards:
    over = (f"{shards} data-parallel shards ({num_devices} devices / parallel.tensor {tensor})"
            if tensor > 1 else f"{num_devices} devices")
    raise ConfigError(f"data.batch_size: {global_batch} does not divide evenly over {over}; "
                      f"use a multiple of {shards}")


def check_experts(model, expert: int) -> None:
  """Refuses an expert axis of X > 1 that the model's experts E do not fill evenly (a model
  without a `moe_experts` field has none)."""
  experts = getattr(model, "moe_experts", None)
  if expert > 1 and (not experts or experts % expert):
    raise ConfigError(f"parallel.expert: {expert} devices on the expert axis need a model whose "
                      f"moe_experts is a multiple of {expert}, got moe_experts={experts}")


def make_strategy(name: str, num_devices: int = 0, fsdp: int = 0, expert: int = 1,
                  tensor: int = 1):
  """The strategy over the first `num_devices` devices (0 = all of them); `fsdp` is the size of
  the fsdp mesh axis under the 'fsdp' strategy (0 = all of them), `expert` and `tensor` those of
  the expert and tensor axes under 'jit' or 'fsdp' (1 = none)."""
  if name not in STRATEGIES:
    raise ConfigError(f"parallel.strategy: unknown strategy {name!r}; expected one of "
                      f"{list(STRATEGIES)}")
  for key, value in (("expert", expert), ("tensor", tensor)):
    if value != 1 and name == "pmap":
      raise ConfigError(f"parallel.{key}: {key} parallelism runs under the 'jit' or 'fsdp' "
                        f"strategy, not 'pmap'")
  devices = None
  if num_devices:
    pool = jax.local_devices() if name == "pmap" else jax.devices()
    if num_devices > len(pool):
      raise ConfigError(f"parallel.devices: {num_devices} requested, only {len(pool)} "
                        f"available")
    if jax.process_count() > 1:
      raise ConfigError("parallel.devices: must be 0 (all devices) in a multi-process run")
    devices = pool[:num_devices]
  if name == "pmap":
    return PmapStrategy(devices)
  return MeshStrategy(name, devices, fsdp if name == "fsdp" else 1, expert, tensor)
