"""Gradient accumulation's step time, and the augmented digits pipeline vs the digits CNN.

  accum    one train step at train.grad_accum = N on a batch of N M rows vs N plain steps on
           batches of M rows: ratio = t(N, N M) / (N t(1, M)) (target <= 1.1), and the compiled
           steps' temporary memory, m(N, N M) / m(1, M) (target <= 1.3: the loop keeps one
           microbatch's activations alive, not N). Same model, optimizer and data; only the
           batch and N differ. For the digits CNN, the digits MLP with BatchNorm, a small char
           GPT and the digits U-Net (`ACCUM_FAMILIES`). Measured at N = 4 on this 2-core CPU,
           otherwise idle, jax 0.10.2, median of 3 runs (wall / CPU seconds, memory; 2026-12-03,
           with XLA's loop-invariant code motion off in the loop's step):
             digits_cnn     scan+xla_cpu    0.97 / 0.85   1.01x
             digits_mlp_bn  scan            0.71 / 0.72   1.28x
             char_gpt       scan            0.96 / 1.00   1.02x
             unet           scan+xla_cpu    1.03 / 0.99   1.02x
           The MLP with BatchNorm and dropout had read 1.57x (2.11 vs 1.34 MB): XLA's while-loop
           invariant code motion had moved the random-number counters of its two dropout masks
           (iotas, 4 x 128 KB, which depend on nothing) out of the loop, and they stayed alive
           through all N microbatches; a step with the loop now compiles without that pass
           (`jaxdl.train.accumulation.compiler_options`), 1.72 MB. The rest is the float32
           gradient sum the scan carries beside the microbatch's gradient, two parameter-sized
           buffers where the one-step program has one: without dropout the MLP reads 1.39x (1.30
           vs 0.94 MB), which no loop form removes. (Before, also measured: the CNN 1.04x, the
           GPT 1.03x; unrolled threefry on the CPU 1.69x for the MLP; the one-microbatch step
           had held a 1.03 MB concatenation of its state for the finiteness check, since
           bounded: `jaxdl.optim.tree_reductions.SMALL_LEAF`.) The unrolled loop is no way out:
           3.83x for the MLP (3.77x for char_gpt), as XLA runs the microbatches' forward passes
           side by side. Peeling the first microbatch out of the loop (no zero-initialized sum)
           changed nothing. (Under a load of 3-5 the U-Net had measured 1.21 / 1.12.) Before the
           convolution rewrite (now `jaxdl.train.xla_cpu`, applied as the loop applies it) the
           scan cost 6-7x (CNN) and 9x (U-Net), and the unrolled loop used for them 3.6-3.9x
           memory.
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


def _built(batch: int, grad_accum: int, overrides: tuple = (), experiment: str = "digits_cnn",
           workarounds: bool = True):
  """(run, jitted step, state, one device batch) of `experiment` at `batch` rows, N =
  grad_accum, compiled as the loop compiles it (`jaxdl.train.xla_cpu.train_program`, switched
  by `workarounds`)."""
  from jaxdl.config import load_config
  from jaxdl.train import build, make_train_step, xla_cpu
  from jaxdl.train.accumulation import compiler_options
  config, _ = load_config(experiment, [
      f"data.batch_size={batch}", f"train.grad_accum={grad_accum}", "parallel.devices=1",
      *overrides])
  r = build(config)
  step = make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key,
                         grad_accum=grad_accum)
  step = jax.jit(xla_cpu.train_program(step, workarounds, grad_accum), donate_argnums=0,
                 compiler_options=compiler_options(grad_accum))
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


# family -> (experiment, M rows per microbatch, overrides): the model families `jaxdl bench
# accum` covers. The GPT is char_gpt shrunk as in the loop bench (d 64, 2 layers).
ACCUM_FAMILIES = {
    "digits_cnn": ("digits_cnn", MICRO, ()),
    "digits_mlp_bn": ("digits_mlp", MICRO, ("model.norm='batch'",)),
    "char_gpt": ("char_gpt", 16, ("model.d_model=64", "model.n_layer=2", "train.eval_every=0")),
    "unet": ("fm_digits_cfg", 64, ()),
}


def temp_bytes(step, state, batch) -> int:
  """The compiled step's temporary buffers (XLA's `memory_analysis().temp_size_in_bytes`): the
  activations and workspace it allocates beyond its arguments and outputs."""
  return int(step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes)


def bench_grad_accum(n: int = 4, steps: int = 5, rounds: int = 5, micro: int = MICRO,
                     overrides: tuple = (), experiment: str = "digits_cnn") -> dict:
  """Seconds per step at N = n on n M rows and at N = 1 on M rows, ratio t_n / (n t_1); and
  the two compiled steps' temporary memory, ratio m_n / m_1."""
  from jaxdl.train import xla_cpu
  _, step_n, state_n, batch_n = _built(n * micro, n, overrides, experiment)
  _, step_1, state_1, batch_1 = _built(micro, 1, overrides, experiment)
  mem_n, mem_1 = temp_bytes(step_n, state_n, batch_n), temp_bytes(step_1, state_1, batch_1)
  loop = "scan+xla_cpu" if xla_cpu.applies(True) else "scan"
  t = interleaved({"accum": _runner(step_n, state_n, batch_n),
                   "micro": _runner(step_1, state_1, batch_1)}, steps=steps, rounds=rounds)
  return {"n": n, "micro_rows": micro, "loop": loop, "accum_step_s": t["accum"]["wall"],
          "micro_step_s": t["micro"]["wall"],
          "ratio": t["accum"]["wall"] / (n * t["micro"]["wall"]),
          "ratio_cpu": t["accum"]["cpu"] / (n * t["micro"]["cpu"]),
          "temp_bytes": mem_n, "micro_temp_bytes": mem_1, "memory_ratio": mem_n / mem_1}


def bench_xla_cpu(experiment: str = "digits_cnn", grad_accum: int = 4, steps: int = 5,
                  rounds: int = 3) -> dict:
  """A user's run with and without `train.xla_cpu_workarounds` (`jaxdl.train.xla_cpu`):
  `experiment` at its own batch with train.grad_accum = N, compiled as the loop compiles it.
  Compile seconds of each, and seconds per step: the median over `rounds` alternations of
  `steps` steps; ratio = with / without (< 0.9: the seam's bar)."""
  import statistics
  import time
  from jaxdl.config import load_config
  batch = int(load_config(experiment, [])[0].data.batch_size)
  out = {"experiment": experiment, "grad_accum": grad_accum, "batch": batch}
  runners = {}
  for name, on in (("with", True), ("without", False)):
    _, step, state, batch_ = _built(batch, grad_accum, (), experiment, workarounds=on)
    t = time.perf_counter()
    step = step.lower(state, batch_).compile()
    out[f"compile_s_{name}"] = time.perf_counter() - t
    runners[name] = _runner(step, state, batch_)
  walls: dict = {k: [] for k in runners}
  for _ in range(rounds):
    for k, run in runners.items():
      walls[k].append(run(steps).wall / steps)
  for k, v in walls.items():
    out[f"step_s_{k}"] = statistics.median(v)
  out["ratio"] = out["step_s_with"] / out["step_s_without"]
  return out


def bench_accum_families(n: int = 4, families=tuple(ACCUM_FAMILIES)) -> dict:
  """`bench_grad_accum` for each family of `ACCUM_FAMILIES`."""
  return {name: bench_grad_accum(n, micro=ACCUM_FAMILIES[name][1],
                                 overrides=ACCUM_FAMILIES[name][2],
                                 experiment=ACCUM_FAMILIES[name][0]) for name in families}


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
