"""Memory levers for long sequences: the compiled GPT train step's temporary bytes
(`compiled.memory_analysis().temp_size_in_bytes`) at T = 4096 with the chunked lm loss
(`train.loss_chunk`, `jaxdl.train.chunked_loss`) and with each rematerialization policy
(`model.remat`, `jaxdl.models.transformer.REMAT_POLICIES`), as ratios to the plain step
(no remat, full logits) compiled in the same run.

The GPT (MODEL): d 256, 4 heads, 4 layers, vocabulary 32768, one row of T = 4096 tokens, AdamW,
fp32, one device. The plain step holds the B x T x V logits (512 MiB here), their softmax and
their gradient; the chunked loss holds one B x C x V block at a time (C = CHUNK). Remat trades
the blocks' saved activations for recomputation in the backward pass; what is left of the step
is the head's and attention's T x T buffers, which the policies keep or recompute differently.
`offload` is compiled only on an accelerator (the cpu backend refuses it: no host memory apart
from its own).

Compiled only (lowered from shapes: nothing is allocated or run), so the numbers are exact for
the backend and independent of the machine's load.

Measured (2026-12-06, CPU backend, jax 0.10.2; compiled, so exact), temporary bytes vs the plain
step's 2.53 GB:

  chunked loss               0.774x  (saves 0.573 GB: 1.07x the 0.537 GB of logits)
  remat full                 0.463x
  remat dots                 0.788x
  remat dots_no_batch        0.516x
  remat full + chunked loss  0.230x
  remat offload              not measured (no accelerator in that session)

The chunked loss adds one recomputation of the head's matmul in the backward pass, 'full' one
forward of every block; their time is not measured here.
"""

from __future__ import annotations

MODEL = dict(d_model=256, n_head=4, n_layer=4, vocab_size=32768, block_size=4096)
SEQ = 4096
ROWS = 1
CHUNK = 512
# (label, model.remat, train.loss_chunk), measured in this order; the first is the baseline.
VARIANTS = (("plain", "none", 0), ("chunked loss", "none", CHUNK), ("remat full", "full", 0),
            ("remat dots", "dots", 0), ("remat dots_no_batch", "dots_no_batch", 0),
            ("remat offload", "offload", 0), ("remat full + chunked loss", "full", CHUNK))


def temp_bytes(remat: str, loss_chunk: int, model_fields: dict = MODEL, seq: int = SEQ,
               rows: int = ROWS) -> dict:
  """{'temp', 'args', 'output'} bytes of the compiled train step (AdamW) of GPT(model_fields,
  remat) with the lm loss at `loss_chunk`, for a batch of `rows` x `seq` tokens."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import optax

  from jaxdl.models.gpt import GPT
  from jaxdl.train import step, tasks

  model = GPT(**{**model_fields, "remat": remat})
  tx = optax.adamw(1e-3)
  task = tasks.make_task(ml_collections.ConfigDict(
      {"task": "lm", "model": {"name": "gpt"}, "train": {"loss_chunk": loss_chunk}}))
  key = jax.random.PRNGKey(0)
  train_step = step.make_train_step(model.apply, task.loss_fn, tx, lambda s: 1e-3, key,
                                    jit=True, loss_weight=task.loss_weight)
  x = jnp.zeros((1, seq), jnp.int32)
  abstract = jax.eval_shape(lambda k: step.create_train_state(model, tx, k, x), key)
  batch = {k: jax.ShapeDtypeStruct((rows, seq), jnp.int32) for k in ("x", "y")}
  mem = train_step.lower(abstract, batch).compile().memory_analysis()
  return {"temp": int(mem.temp_size_in_bytes), "args": int(mem.argument_size_in_bytes),
          "output": int(mem.output_size_in_bytes)}


def bench_memory() -> dict:
  """`temp_bytes` of every VARIANT this backend compiles, and the logits' bytes B T V 4."""
  import jax
  on_cpu = jax.default_backend() == "cpu"
  by_variant = {label: temp_bytes(remat, chunk) for label, remat, chunk in VARIANTS
                if not (on_cpu and remat == "offload")}
  return {"model": MODEL, "seq": SEQ, "rows": ROWS, "chunk": CHUNK,
          "backend": jax.default_backend(),
          "logits_bytes": ROWS * SEQ * MODEL["vocab_size"] * 4, "by_variant": by_variant}
