"""Sequence parallelism's memory and time: one row of a long sequence split over S = 1, 2, 4
devices (`parallel.sequence`, `jaxdl.models.ring_attention`), on emulated CPU devices.

The GPT (MODEL): d 128, 4 heads, 2 layers, vocabulary 32768, one row of T = 4096 tokens, AdamW,
fp32, ring attention, the mesh ('sequence',) = (S,) over the first S of 4 devices. Per S:

  temp        the compiled train step's temporary bytes per device
              (`compiled.memory_analysis().temp_size_in_bytes`): activations, the logits and
              attention's blocks, which the split divides by S
  temp_chunk  the same with the chunked loss (`train.loss_chunk` = CHUNK): the B x T x V logits
              (and their gradient) never materialized, one B x C x V block at a time
  step_s      the step's median wall seconds over STEPS runs
and the ring's compute: `sequence_attention` forward at S = 4 (T = 4096, 4 heads of 32),
causal vs non-causal, wall seconds and the c x c blocks each device computed (2 S + 1 vs 4 S).

On one CPU the S "devices" are threads of the same cores: step times at S > 1 are not
speedups, only what the collectives and the split cost there; the memory is per device and
exact (compiled, so independent of the machine's load). Under fewer than 4 CPU devices (a plain
`jaxdl bench`) it runs in a subprocess with 4 emulated devices.

Measured (2026-12-06, 2-core CPU shared with other jobs at a load average of ~10, 4 emulated
devices, jax 0.10.2; bytes compiled, so exact; seconds medians of 3):

  S   temp per device      with loss_chunk=512   logits per device   step s
  1   1651 MB              1053 MB (0.638x)      537 MB              5.70
  2    675 MB (0.409x)      527 MB (0.781x)      268 MB              9.62
  4    369 MB (0.224x)      294 MB (0.796x)      134 MB              8.64
  ring attention at S = 4, T = 4096: causal 9 blocks a device vs 16 non-causal (9/16 = (2S+1)/4S),
  0.379 vs 0.974 s forward (0.389x)

The S > 1 steps are slower here (1.69x, 1.52x; a second run 1.90x, 0.89x, the same bytes): S
emulated devices share the same two cores, so the numbers are what the collectives and the split
cost on one CPU, noisy on a shared machine, not a speedup. The chunked
loss saves 597 MB at S = 1 (1.11x the logits) but 148 MB and 75 MB at S = 2 and 4 (0.55x and
0.56x a device's logits): with the logits gone, other buffers of the step set its peak.
"""

from __future__ import annotations

import json
import time

from jaxdl.bench.emulated import on_cpu_devices

DEVICES = 4
SEQS = (1, 2, 4)
MODEL = dict(d_model=128, n_head=4, n_layer=2, vocab_size=32768, block_size=4096)
SEQ = 4096
CHUNK = 512
STEPS = 3


def _median(xs):
  return sorted(xs)[len(xs) // 2]


def _timed(fn, *args, steps: int) -> float:
  import jax
  jax.block_until_ready(fn(*args))  # compile and warm
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return _median(times)


def measure(seqs=SEQS, model_fields: dict = MODEL, seq: int = SEQ, chunk: int = CHUNK,
            steps: int = STEPS) -> dict:
  """{'by_sequence': {S: {'temp', 'temp_chunk', 'step_s'}}, 'ring': {...}} (module docstring)."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import optax

  from jaxdl.models.gpt import GPT
  from jaxdl.models.ring_attention import sequence_attention, to_layout
  from jaxdl.train import step, strategies, tasks
  from jaxdl.train.assembly import apply_precision
  from jaxdl.optim import precision

  tx = optax.adamw(1e-3)
  key = jax.random.PRNGKey(0)
  x = jnp.zeros((1, seq), jnp.int32)
  base = GPT(**model_fields)
  abstract = jax.eval_shape(lambda k: step.create_train_state(base, tx, k, x), key)
  by = {}
  for s in seqs:
    strategy = strategies.make_strategy("jit", s, sequence=s)
    model = apply_precision(base, precision.get_policy("fp32"), strategy.model_overrides)
    out = {}
    for name, loss_chunk in (("temp", 0), ("temp_chunk", chunk)):
      task = tasks.make_task(ml_collections.ConfigDict(
          {"task": "lm", "model": {"name": "gpt"}, "train": {"loss_chunk": loss_chunk},
           "parallel": {"sequence": s}}))
      train_step = step.make_train_step(model.apply, task.loss_fn, tx, lambda _: 1e-3, key,
                                        loss_weight=task.loss_weight)
      fn = strategy.compile_train(train_step, abstract)
      state = strategy.place_state(jax.jit(lambda k: step.create_train_state(base, tx, k, x))(key))
      tokens = jax.random.randint(key, (1, seq), 0, model_fields["vocab_size"])
      batch = strategy.shard_batch({"x": tokens, "y": tokens})
      compiled = fn.lower(state, batch).compile()
      out[name] = int(compiled.memory_analysis().temp_size_in_bytes)
      if not loss_chunk:
        def run(state, batch, compiled=compiled):
          new_state, metrics = compiled(state, batch)
          return metrics
        # The state is donated: each timed call gets a fresh copy.
        out["step_s"] = _timed(lambda st, b: run(jax.tree.map(jnp.copy, st), b), state, batch,
                               steps=steps)
    by[s] = out
  # The ring's compute at the largest S: causal (blocks skipped) vs non-causal.
  s = max(seqs)
  spec = strategies.make_strategy("jit", s, sequence=s).model_overrides.get("sequence")
  ring = {"seq": s}
  if spec is not None:
    h, k = model_fields["n_head"], model_fields["d_model"] // model_fields["n_head"]
    q, kk, v = (to_layout(jax.random.normal(jax.random.fold_in(key, i), (1, seq, h, k)), s)
                for i in range(3))
    for causal in (True, False):
      f = jax.jit(lambda q, kk, v, causal=causal: sequence_attention(
          q, kk, v, spec, causal=causal, count_blocks=True))
      _, blocks = f(q, kk, v)
      ring["causal" if causal else "non_causal"] = {
          "s": _timed(f, q, kk, v, steps=steps), "blocks_per_device": int(blocks[0])}
  return {"model": model_fields, "seq": seq, "chunk": chunk, "devices": DEVICES,
          "logits_bytes": seq * model_fields["vocab_size"] * 4, "by_sequence": by, "ring": ring}


def bench_sequence() -> dict:
  """`measure()` here when there are 4 CPU devices, else in a subprocess that has them."""
  result = on_cpu_devices(measure, "jaxdl.bench.sequence", DEVICES)
  result["by_sequence"] = {int(k): v for k, v in result["by_sequence"].items()}
  return result


if __name__ == "__main__":
  print(json.dumps(measure()))
