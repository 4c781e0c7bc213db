"""`make_strategy(name, devices, fsdp, expert, tensor, sequence)`: the parallel strategy a run
trains under.

  jit   `jit` over the named mesh ('data', 'fsdp', 'expert', 'tensor') with F = 1
        (`jaxdl.train.mesh`): the state replicated unless `expert` = X > 1 or `tensor` = T > 1
        split a mixture's experts or a transformer's heads, MLP and vocabulary
        (`jaxdl.train.sharding_rules`)
  fsdp  the same mesh with F = `fsdp` (0 = all devices left): every leaf also split over 'fsdp'
  (either, with `sequence` = S > 1: a GPT's positions split over S devices of the 'sequence'
  axis, attention by a ring or all-gathered keys and values, `jaxdl.models.ring_attention`)
  pmap  one program per device with `axis_name` collectives (`jaxdl.train.pmap`)

Every strategy has the same interface (place_state, shard_batch, compile_train, compile_eval,
single_copy, first, state_shardings, describe, batch_shards), which is all the loop sees. Every
bad `parallel.*` setting is a `ConfigError` naming it, raised before anything is built.
"""

from __future__ import annotations

from typing import Callable

import jax

from jaxdl.models.gpt import GPT
from jaxdl.schema import ConfigError
from jaxdl.train.mesh import MeshStrategy
from jaxdl.train.pmap import PmapStrategy
from jaxdl.train.sharding_rules import check_layout, check_tensor

STRATEGIES = ("fsdp", "jit", "pmap")

__all__ = ["STRATEGIES", "check_batch", "check_experts", "check_layout", "check_sequence",
           "check_tensor", "make_strategy"]


def check_batch(global_batch: int, num_devices: int, tensor: int = 1, sequence: int = 1) -> None:
  """Refuses a global batch that the `num_devices / (tensor sequence)` batch shards do not
  split evenly (the devices of a tensor or sequence group share their rows)."""
  shards = num_devices // (tensor * sequence)
  if global_batch % shards:
    groups = " x ".join(f"parallel.{k} {v}" for k, v in (("tensor", tensor),
                                                         ("sequence", sequence)) if v > 1)
    over = (f"{shards} data-parallel shards ({num_devices} devices / {groups})"
            if groups else f"{num_devices} devices")
    raise ConfigError(f"data.batch_size: {global_batch} does not divide evenly over {over}; "
                      f"use a multiple of {shards}")


def check_experts(model, expert: int) -> None:
  """Refuses an expert axis of X > 1 that the model's experts E do not fill evenly (a model
  without a `moe_experts` field has none)."""
  experts = getattr(model, "moe_experts", None)
  if expert > 1 and (not experts or experts % expert):
    raise ConfigError(f"parallel.expert: {expert} devices on the expert axis need a model whose "
                      f"moe_experts is a multiple of {expert}, got moe_experts={experts}")


def check_sequence(model, model_name: str, task_kind, seq_len: Callable[[], int],
                   sequence: int) -> None:
  """Refuses a 'sequence' axis of S > 1 that cannot split this run: a model that is not a GPT
  (a recurrence such as the RNN runs through the positions in order), a GPT whose mixer is the
  SSM's recurrence, attention dropout or a mixture of experts (whose capacity is shared in
  token order), a task that is not a language model's, or 2 S chunks that do not divide the
  sequence length T = `seq_len()` (causal load balancing: `jaxdl.models.ring_attention`)."""
  if sequence == 1:
    return
  if not isinstance(model, GPT):
    kind = ("a recurrence: its state runs through the positions in order"
            if model_name in ("rnn", "lstm", "seq2seq") else "not a GPT")
    raise ConfigError(f"parallel.sequence: model {model_name!r} is {kind}; splitting the "
                      f"sequence needs model.name='gpt' (got parallel.sequence={sequence}, use 1)")
  for bad, why in ((model.mixer != "attention",
                    f"mixer={model.mixer!r} is a recurrence that runs through the positions in "
                    "order and cannot split the sequence; use model.mixer='attention'"),
                   (model.attn_dropout > 0, "the split attention has no attention dropout; set "
                    "model.attn_dropout=0"),
                   (model.moe_experts > 0, "a mixture of experts shares its capacity in token "
                    "order, which the split reorders; set model.moe_experts=0"),
                   (not task_kind.sequence_model, "only a language model's sequence is split")):
    if bad:
      raise ConfigError(f"parallel.sequence: {sequence} devices: {why} (or "
                        f"parallel.sequence=1)")
  t = seq_len()
  if t % (2 * sequence):
    raise ConfigError(f"parallel.sequence: {sequence} devices hold 2 x {sequence} = "
                      f"{2 * sequence} chunks of the sequence (causal load balancing), which "
                      f"do not divide its length {t}; use a sequence length that "
                      f"{2 * sequence} divides or another parallel.sequence")


def make_strategy(name: str, num_devices: int = 0, fsdp: int = 0, expert: int = 1,
                  tensor: int = 1, sequence: int = 1, sequence_attention: str = "ring"):
  """The strategy over the first `num_devices` devices (0 = all of them); `fsdp` is the size of
  the fsdp mesh axis under the 'fsdp' strategy (0 = all of them), `expert`, `tensor` and
  `sequence` those of the expert, tensor and sequence axes under 'jit' or 'fsdp' (1 = none);
  `sequence_attention` 'ring' or 'allgather'."""
  if name not in STRATEGIES:
    raise ConfigError(f"parallel.strategy: unknown strategy {name!r}; expected one of "
                      f"{list(STRATEGIES)}")
  for key, value in (("expert", expert), ("tensor", tensor), ("sequence", sequence)):
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
  return MeshStrategy(name, devices, fsdp if name == "fsdp" else 1, expert, tensor, sequence,
                      sequence_attention)
