"""Gradient accumulation's step time, and the augmented digits pipeline vs the digits CNN.

  accum    one train step at train.grad_accum = N on a batch of N M rows vs N plain steps on
           batches of M rows: ratio = t(N, N M) / (N t(1, M)); the scan over microbatches costs
           nothing beyond the microbatch steps when it is <= 1.1 (target). Same model, optimizer
           and data; only the batch and N differ. Run for the digits CNN and for a small GPT:
           on XLA:CPU a convolution's kernel gradient inside a loop body (the scan) is far slower
           than outside one (jax-ml/jax#12868), which the CNN row shows and the GPT row does not.
           Measured under a load average of ~25 (N = 4): CNN, M = 128, 12.9x wall (10.8x CPU
           seconds); char_gpt, M = 16, 1.08x wall (0.96x CPU): the target is met where the
           loop body has no convolution. Fully unrolling the microbatch scan
           (`lax.scan(..., unroll=True)`) takes the CNN to 1.50x (1.36x CPU), but it is not
           adopted: it compiles N copies of the step and frees the scheduler to keep several
           microbatches' activations alive at once, the memory the accumulation exists to save.
  augment  batches/s of the digits training pipeline with data.augment (random shifts by pad +
           crop, then mixup) at batch M vs the CNN train step's steps/s at batch M: >= 1 means
           the step never waits for data (the pipeline runs in the calling thread here, with no
           prefetch, so this is the worst case); and on 32 x 32 RGB images with crop, flip,
           colour jitter and mixup against the same CNN's step on them.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxdl.bench.timing import Clock, interleaved

MICRO = 128  # M, the rows of one microbatch (the digits experiments' batch)


def _built(batch: int, grad_accum: int, overrides: tuple = (), experiment: str = "digits_cnn"):
  """(run, jitted step, state, one device batch) of `experiment` at `batch` rows, N =
  grad_accum."""
  from jaxdl.config import load_config
  from jaxdl.train import build, make_train_step
  config, _ = load_config(experiment, [
      f"data.batch_size={batch}", f"train.grad_accum={grad_accum}", "parallel.devices=1",
      *overrides])
  r = build(config)
  step = make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key,
                         jit=True, grad_accum=grad_accum)
  batch_ = jax.device_put(next(r.ds.train_iter()))
  return r, step, r.init_state(), batch_


def _runner(step, state, batch):
  """`run(n) -> Clock` over n steps of `step` on one fixed device batch (compiled first)."""
  holder = {"state": step(state, batch)[0]}
  jax.block_until_ready(holder["state"])

  def run(n):
    with Clock() as clock:
      s = holder["state"]
      for _ in range(n):
        s, metrics = step(s, batch)
      jax.block_until_ready(metrics)
      holder["state"] = s
    return clock

  return run


def bench_grad_accum(n: int = 4, steps: int = 5, rounds: int = 5, micro: int = MICRO,
                     overrides: tuple = (), experiment: str = "digits_cnn") -> dict:
  """Seconds per step at N = n on n M rows and at N = 1 on M rows; ratio t_n / (n t_1)."""
  _, step_n, state_n, batch_n = _built(n * micro, n, overrides, experiment)
  _, step_1, state_1, batch_1 = _built(micro, 1, overrides, experiment)
  t = interleaved({"accum": _runner(step_n, state_n, batch_n),
                   "micro": _runner(step_1, state_1, batch_1)}, steps=steps, rounds=rounds)
  return {"n": n, "micro_rows": micro, "accum_step_s": t["accum"]["wall"],
          "micro_step_s": t["micro"]["wall"],
          "ratio": t["accum"]["wall"] / (n * t["micro"]["wall"]),
          "ratio_cpu": t["accum"]["cpu"] / (n * t["micro"]["cpu"])}


def _pipeline_vs_step(it, step, state, batch, steps: int, rounds: int) -> dict:
  """Batches/s of the iterator `it` (read to host arrays) vs steps/s of `step`, interleaved."""
  def pipeline(k):
    with Clock() as clock:
      for _ in range(k):
        np.asarray(next(it)["x"])
    return clock

  t = interleaved({"pipeline": pipeline, "step": _runner(step, state, batch)}, steps=steps,
                  rounds=rounds)
  return {"batches_per_s": 1.0 / t["pipeline"]["wall"], "steps_per_s": 1.0 / t["step"]["wall"],
          "ratio": t["step"]["wall"] / t["pipeline"]["wall"],
          "ratio_cpu": t["step"]["cpu"] / t["pipeline"]["cpu"]}


def bench_augment(ops: tuple = ("crop=1", "mixup"), steps: int = 20, rounds: int = 5) -> dict:
  """Augmented digits batches/s vs the CNN's train steps/s, both at M rows."""
  r, step, state, batch = _built(MICRO, 1, (f"data.augment={tuple(ops)!r}",))
  it = r.ds.train_iter()

  return {"ops": list(ops), "rows": MICRO,
          **_pipeline_vs_step(it, step, state, batch, steps, rounds)}


def bench_augment_rgb(ops: tuple = ("crop=4", "flip", "jitter", "mixup"), rows: int = MICRO,
                      steps: int = 10, rounds: int = 3) -> dict:
  """Every record-level op on 32 x 32 RGB images (random pixels, 10 classes) vs the train step
  of the same CNN (two conv-ReLU-pool blocks) on them, both at `rows` rows."""
  import jax.numpy as jnp
  import ml_collections
  import optax
  from jaxdl.data import Split, TrainIterator
  from jaxdl.data.augment import Augmentation, parse_ops
  from jaxdl.models.cnn import CNN
  from jaxdl.train import create_train_state, make_task, make_train_step
  rng = np.random.default_rng(0)
  x_N = rng.uniform(size=(2048, 32, 32, 3)).astype(np.float32)
  y_N = rng.integers(0, 10, 2048).astype(np.int32)
  split = Split(len(y_N), lambda idx: {"x": x_N[idx], "y": y_N[idx]})
  it = TrainIterator(split, batch_size=rows, seed=0, shuffle=True, process_index=0,
                     process_count=1, augment=Augmentation(parse_ops(ops), 0, 10))
  model, tx = CNN(features=(32, 64), out=10), optax.adamw(1e-3)
  task = make_task(ml_collections.ConfigDict({"task": "classification", "train": {}}))
  batch = jax.device_put(next(it))
  state = create_train_state(model, tx, jax.random.PRNGKey(0), jnp.asarray(batch["x"][:1]))
  step = make_train_step(model.apply, task.loss_fn, tx, optax.constant_schedule(1e-3),
                         jax.random.PRNGKey(1), jit=True)

  return {"ops": list(ops), "rows": rows,
          **_pipeline_vs_step(it, step, state, batch, steps, rounds)}
