"""Tensor parallelism's memory: the compiled GPT train step's per-device argument and temporary
bytes (XLA's `compiled.memory_analysis()`) at tensor T = 1, 2, 4 on 4 CPU devices.

Mesh ('data', 'tensor') = (4 / T, T) under the `jit` strategy, AdamW, a GPT of d 256, 8 heads,
4 layers, MLP hidden 1024, vocabulary 4096, context 128; each data-parallel shard gets the same
ROWS rows at every T, so without tensor parallelism every device would hold the same arguments
and activations. With it:

  arguments  the state: parameters, m and v; a leaf the rules split (`jaxdl.train.sharding_rules`:
             heads, MLP hidden, vocabulary) holds 1/T of itself per device, the others (norms,
             positions, biases of D outputs) whole. `plan` is that sum from the shardings alone;
             the measured bytes (less the batch) match it, and fall towards 1/T
  temporary  activations and gradients the step keeps: those of the split layers fall too

Compiled only (lowered from shapes: nothing is allocated or run), so the numbers are exact and
independent of the machine's load. Under fewer than 4 CPU devices (a plain `jaxdl bench`) the
measurement runs in a subprocess with 4 emulated devices.

Measured (2026-12-01, 2-core CPU, 4 emulated devices): arguments per device 0.505x at T = 2
and 0.257x at T = 4 of T = 1's; temporaries 0.57x and 0.35x.
"""

from __future__ import annotations

import json

from jaxdl.bench.emulated import on_cpu_devices

TENSORS = (1, 2, 4)
DEVICES = 4
ROWS = 4  # per data-parallel shard
MODEL = dict(d_model=256, n_head=8, n_layer=4, mlp_hidden=1024, vocab_size=4096, block_size=128)


def measure(tensors=TENSORS) -> dict:
  """{T: {'args', 'temp', 'batch', 'plan'}} bytes per device (this process's first 4 devices)."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np
  import optax

  from jaxdl.models.gpt import GPT
  from jaxdl.train import step, strategies, tasks

  model = GPT(**MODEL)
  tx = optax.adamw(1e-3)
  task = tasks.make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  key = jax.random.PRNGKey(0)
  train_step = step.make_train_step(model.apply, task.loss_fn, tx, lambda s: 1e-3, key)
  x = jnp.zeros((1, MODEL["block_size"]), jnp.int32)
  abstract = jax.eval_shape(lambda k: step.create_train_state(model, tx, k, x), key)
  out = {}
  for t in tensors:
    strategy = strategies.make_strategy("jit", DEVICES, tensor=t)
    shardings = strategy.state_shardings(abstract)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    rows = ROWS * strategy.batch_shards
    batch = {k: jax.ShapeDtypeStruct((rows, MODEL["block_size"]), jnp.int32,
                                     sharding=strategy.batch_sharding) for k in ("x", "y")}
    compiled = strategy.compile_train(train_step, abstract).lower(state, batch).compile()
    mem = compiled.memory_analysis()
    plan = sum(a.size * a.dtype.itemsize // int(np.prod([strategy.mesh.shape[ax]
                                                         for ax in _axes(s.spec)]))
               for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)))
    out[t] = {"args": int(mem.argument_size_in_bytes), "temp": int(mem.temp_size_in_bytes),
              "batch": 2 * ROWS * MODEL["block_size"] * 4, "plan": int(plan)}
  return out


def _axes(spec) -> list[str]:
  names = []
  for entry in spec:
    names += list(entry) if isinstance(entry, tuple) else [entry] if entry else []
  return names


def bench_tensor_memory() -> dict:
  """`measure()` here when there are 4 CPU devices, else in a subprocess that has them."""
  result = {int(k): v for k, v in
            on_cpu_devices(measure, "jaxdl.bench.tensor", DEVICES, timeout=600).items()}
  return {"model": MODEL, "rows_per_shard": ROWS, "devices": DEVICES, "by_tensor": result}


if __name__ == "__main__":
  print(json.dumps(measure()))
