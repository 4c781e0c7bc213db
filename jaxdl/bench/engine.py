"""Engine costs, each against a baseline timed in the same run.

  loop        `jaxdl.train.run` steps/s vs a bare `for` loop over the same jitted step on one
              fixed batch: overhead = 1 - loop / bare (data, sharding, metrics reads, logging).
              The loop's rate is taken between the dispatch times of its steps k0 and n (after
              compilation, before the final eval and checkpoint).
  watch       the health signals (`jaxdl.train.watch`) per step at one watched step in K, vs
              the plain step: the cond branch, the watched step's norms, the detailed probe.
  checkpoint  seconds the caller is blocked by an async save vs the whole synchronous save of
              the same state (orbax, through `jaxdl.train.checkpoint.Checkpointer`).
  data        training batches/s of the grain pipeline vs the train step's steps/s.
  sampler     `make_sampler` (N updates in one `lax.scan`) vs N x the same compiled update
              (`make_step`) timed alone: what the loop itself costs; and the same samples as a
              Python loop over that step. `bench_sampler_nfe`: the seconds per sample of each
              sampler at the same number of network calls as Euler's (`nfe_sweep.steps_for_calls`:
              heun N/2 steps, edm_heun N/2 + 1 on the flow, the multistep rules N): what a rule's
              own arithmetic (Heun's correction, DPM-Solver++'s history) adds to the calls.

Measured (`jaxdl bench --only loop,watch`, this 2-core CPU under a load average of about 25):
loop 11.0 vs bare 10.6 steps/s (wall overhead -3.6%: within the noise), CPU seconds per step
0.0401 vs 0.0387 (overhead 3.7%, target <= 5%); per step with one watched step in 100 (plain
0.0400 s): cheap 0.0393 s, detailed 0.0394 s (a watched step 0.0489 s and the probe 0.0109 s, so
(0.0489 - 0.0393 + 0.0109) / 100 ~ 0.0002 s per step, 0.5%; targets 5% and 10%).
`bench_sampler_nfe` (fm_digits_cfg's U-Net at init, 64 samples, 20 calls each, 5 rounds, the
2-core CPU otherwise idle, 2026-12-02): seconds per sample over Euler's (3.51 ms), wall / CPU:
heun 0.97 / 0.99, edm_heun 0.97 / 0.98, dpmpp_2m 0.99 / 0.99, dpmpp_3m 0.83 / 0.84 (target
<= 1.05). An earlier run under a load average of ~8 had CPU ratios 0.80-1.03 and wall ratios
1.1-2.5: the load, not the solvers. The lax-loop rows of the same run: fm_toy2d 1.03 / 1.02,
fm_digits_cfg 0.96 / 0.97.
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.bench.timing import Clock, interleaved


# ---------------------------------------------------------------------------------------------
# Loop overhead.

@contextlib.contextmanager
def _recording_strategy(on_step):
  """Makes `jaxdl.train.run` build strategies whose compiled step calls `on_step(fn, batch,
  out)` after dispatching each step."""
  from jaxdl.train import strategies
  original = strategies.make_strategy

  def make(*args, **kwargs):
    strategy = original(*args, **kwargs)
    compile_train = strategy.compile_train

    def compile_and_record(train_step, state, compiler_options=None):
      fn = compile_train(train_step, state, compiler_options)

      def timed(state, batch):
        out = fn(state, batch)
        on_step(fn, batch, out)
        return out

      return timed

    strategy.compile_train = compile_and_record
    return strategy

  strategies.make_strategy = make
  try:
    yield
  finally:
    strategies.make_strategy = original


LOOP_OVERRIDES = {"model.d_model": 64, "model.n_layer": 2, "data.batch_size": 16,
                  "train.eval_every": 0, "train.ckpt_every": 0, "train.plot": False,
                  "data.max_eval_windows": 16}  # char_gpt's config shrunk for the loop benches


def bench_loop(char_gpt, segments: int = 6, segment: int = 8, burst: int = 8,
               warmup: int = 3) -> dict:
  """`jaxdl.train.run` on a shrunk char_gpt (its config `char_gpt` at `LOOP_OVERRIDES`: d 64,
  2 layers, batch 16 x 64) vs a bare loop.

  One run, one compilation: after `warmup` steps the loop runs `segment` steps, then (inside
  the step wrapper) bare bursts of `burst` steps of the same compiled function on a copy of the
  state -- plain, reading each step's loss one step late (the loop's pattern) and two steps
  late -- and so on, alternating. A loop segment is timed between dispatches and skips the two
  steps after each burst (the device queue refills); each side keeps its best per-step time.
  Wall time and process CPU time are both kept: on a loaded machine every blocking read of a
  metric pays the scheduler's wake-up latency in wall time, which CPU time does not see.
  """
  from jaxdl.config import variant_config
  from jaxdl.train import run
  bursts_at = [warmup + (k + 1) * (segment + 2) for k in range(segments - 1)]
  steps = warmup + segments * (segment + 2)
  config = variant_config(char_gpt, {**LOOP_OVERRIDES, "train.steps": steps})
  rec = {"times": [], "cpu": [], "bare": None, "bare_s": [], "bare_cpu_s": [], "lag1_s": [],
         "lag2_s": []}

  def on_step(fn, batch, out):
    rec["times"].append(time.perf_counter())
    rec["cpu"].append(time.process_time())
    if len(rec["times"]) in bursts_at:
      if rec["bare"] is None:
        rec["bare"] = jax.tree.map(jnp.copy, out[0])
      state = rec["bare"]
      with Clock() as clock:
        for _ in range(burst):
          state, metrics = fn(state, batch)
        jax.block_until_ready(metrics)
      rec["bare_s"].append(clock.wall / burst)
      rec["bare_cpu_s"].append(clock.cpu / burst)
      for lag in (1, 2):  # the loop's read pattern (lag 1): dispatch s, then fetch s-lag's loss
        with Clock() as clock:
          queue = []
          for _ in range(burst):
            state, metrics = fn(state, batch)
            queue.append(metrics)
            if len(queue) > lag:
              float(queue.pop(0)["loss"])
          for m in queue:
            float(m["loss"])
        rec[f"lag{lag}_s"].append(clock.wall / burst)
      rec["bare"] = state

  with tempfile.TemporaryDirectory() as tmp, _recording_strategy(on_step):
    run(config, pathlib.Path(tmp) / "run", progress=False)
  # t[i], c[i]: clocks right after dispatching step i + 1 (before a burst run at that step).
  # Segment k spans the dispatches of steps a..e: it starts two steps after a burst and ends
  # where the next burst starts, so no burst time falls inside it.
  t, c = rec["times"], rec["cpu"]
  edges = [warmup] + [b + 2 for b in bursts_at]
  ends = bursts_at + [len(t)]
  loop_s = [(t[e - 1] - t[a - 1]) / (e - a) for a, e in zip(edges, ends)]
  loop_cpu_s = min((c[e - 1] - c[a - 1]) / (e - a) for a, e in zip(edges, ends))
  loop_rate, bare_rate = 1.0 / min(loop_s), 1.0 / min(rec["bare_s"])
  return {"loop_steps_per_s": loop_rate, "bare_steps_per_s": bare_rate,
          "lag1_bare_steps_per_s": 1.0 / min(rec["lag1_s"]),
          "lag2_bare_steps_per_s": 1.0 / min(rec["lag2_s"]),
          "overhead": 1.0 - loop_rate / bare_rate, "loop_s_per_segment": loop_s,
          "loop_cpu_s": loop_cpu_s, "bare_cpu_s": min(rec["bare_cpu_s"]),
          "overhead_cpu": loop_cpu_s / min(rec["bare_cpu_s"]) - 1.0,
          **{f"{k}_per_burst": rec[k] for k in ("bare_s", "lag1_s", "lag2_s")}, "steps": steps}


# ---------------------------------------------------------------------------------------------
# Checkpoint cost.

def bench_checkpoint(state, rounds: int = 3) -> dict:
  """Blocked seconds per save, async vs sync, alternating; the first save of each is a warm-up."""
  from jaxdl.train.checkpoint import Checkpointer
  blocked = {"sync": [], "async": []}
  nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  with tempfile.TemporaryDirectory() as tmp:
    ckpts = {name: Checkpointer(pathlib.Path(tmp) / name, keep=2, async_save=name == "async")
             for name in blocked}
    for r in range(rounds + 1):
      for name, ckpt in ckpts.items():
        start = time.perf_counter()
        ckpt.save(r, state, data_state={"step": r}, config={}, manifest={})
        elapsed = time.perf_counter() - start
        ckpt.wait()
        if r:
          blocked[name].append(elapsed)
    for ckpt in ckpts.values():
      ckpt.close()
  sync_s, async_s = float(np.median(blocked["sync"])), float(np.median(blocked["async"]))
  return {"bytes": int(nbytes), "sync_s": sync_s, "async_blocked_s": async_s,
          "ratio": async_s / sync_s}


def synthetic_state(abstract):
  """Arrays of the given shapes (values do not matter to the writer)."""
  return jax.tree.map(lambda s: jnp.full(s.shape, 0.5, s.dtype), abstract)


# ---------------------------------------------------------------------------------------------
# Data pipeline.

def bench_data(batch: int, context: int, n: int = 50) -> dict:
  """Batches/s of the byte-text training pipeline at the GPT benchmark's batch and context."""
  from jaxdl import data as jdata
  from jaxdl.config import base_config
  config = base_config()
  config.data = jdata.default_data_config("text")
  config.data.batch_size = batch
  config.data.context_length = context
  ds = jdata.make_dataset(config)
  it = ds.train_iter()
  next(it)
  start = time.perf_counter()
  for _ in range(n):
    b = next(it)
    np.asarray(b["x"])
  return {"batches_per_s": n / (time.perf_counter() - start), "batches": n}


# ---------------------------------------------------------------------------------------------
# Sampler: lax loop vs Python loop.

def _sampler_case(config):
  """(model, variables, path, sampler kwargs) of an experiment config's denoiser at its init:
  the sampler and step count of its config, unconditional (y = None, no guidance)."""
  from jaxdl import models as jmodels
  from jaxdl.generative import tasks
  gen, shape = config.gen, tuple(config.gen.sample_shape)
  model = jmodels.build_model(config.model)
  variables = jax.jit(lambda k: model.init(k, jnp.zeros((1,) + shape), jnp.zeros((1,)),
                                           train=False))(jax.random.PRNGKey(0))
  kw = dict(sampler=gen.sampler, steps=int(gen.steps), sample_shape=shape,
            prediction=gen.prediction, num_classes=gen.num_classes, clip_x0=gen.clip_x0)
  return model, variables, tasks.path_from_config(config), kw


def bench_sampler(config, batch: int = 256, rounds: int = 5) -> dict:
  """What the sampler's loop costs: seconds per `make_sampler` call (N updates in one
  `lax.scan`) over N x the seconds of the same compiled update alone (`make_step`, called N
  times from Python on the same inputs the scan feeds it: x, i, fold_in(k_loop, i)); and the
  scan's samples against that Python loop's (the same samples). `config`: the experiment's
  (fm_toy2d's)."""
  from jaxdl.generative import samplers, stepwise
  model, variables, path, kw = _sampler_case(config)
  n = kw["steps"]
  rng = jax.random.PRNGKey(1)
  lax_fn = samplers.make_sampler(model.apply, path, **kw)
  step = stepwise.make_step(model.apply, path, **kw)
  k_init, k_loop = jax.random.split(rng)
  x0 = jax.random.normal(k_init, (batch,) + kw["sample_shape"], jnp.float32)
  i_N = [jnp.asarray(i) for i in range(n)]
  key_N = [jax.random.fold_in(k_loop, i) for i in range(n)]

  last = {}

  def steps_alone(_):
    x = x0
    with Clock() as clock:
      for i in range(n):
        x = step(variables, x, i_N[i], key_N[i], None)
      x.block_until_ready()
    last["x"] = x  # the Python loop's sample: the scan must give the same
    return clock

  def scan(_):
    with Clock() as clock:
      lax_fn(variables, rng, batch).block_until_ready()
    return clock

  steps_alone(1), scan(1)  # compile both
  best = interleaved({"lax": scan, "steps": steps_alone}, steps=1, rounds=rounds)
  diff = float(jnp.max(jnp.abs(lax_fn(variables, rng, batch) - last["x"])))
  return {"experiment": config.name, "sampler": kw["sampler"], "steps": n, "batch": batch,
          "max_abs_diff": diff, "lax_s": best["lax"]["wall"], "steps_s": best["steps"]["wall"],
          "ratio": best["lax"]["wall"] / best["steps"]["wall"],
          "ratio_cpu": best["lax"]["cpu"] / best["steps"]["cpu"]}


def bench_sampler_nfe(config, batch: int = 64, calls: int = 20,
                      names=("heun", "edm_heun", "dpmpp_2m", "dpmpp_3m"),
                      rounds: int = 5) -> dict:
  """Seconds per sample of each sampler in `names` and of Euler, all at `calls` network calls
  per sample, on the experiment config's (fm_digits_cfg's) denoiser at its init
  (unconditional), timed in alternation; ratio = a sampler's best time over Euler's, wall and
  CPU."""
  from jaxdl.generative import nfe_sweep, samplers
  model, variables, path, kw = _sampler_case(config)
  rng = jax.random.PRNGKey(1)
  steps, fns = {}, {}
  for name in ("euler", *names):
    steps[name] = nfe_sweep.steps_for_calls(path, name, calls)
    got = samplers.network_calls(path, sampler=name, steps=steps[name])
    if got != calls:
      raise ValueError(f"{name}: no step count gives {calls} calls on the {path.name!r} path "
                       f"({steps[name]} steps give {got})")
    fns[name] = samplers.make_sampler(model.apply, path, **{**kw, "sampler": name,
                                                             "steps": steps[name]})

  def timed(fn):
    def run(_):
      with Clock() as clock:
        fn(variables, rng, batch).block_until_ready()
      return clock
    return run

  runs = {name: timed(fn) for name, fn in fns.items()}
  for run in runs.values():
    run(1)  # compile
  best = interleaved(runs, steps=1, rounds=rounds)
  return {"experiment": config.name, "batch": batch, "calls": calls, "steps": steps,
          "sample_s": {k: v["wall"] / batch for k, v in best.items()},
          "sample_cpu_s": {k: v["cpu"] / batch for k, v in best.items()},
          "ratio": {k: best[k]["wall"] / best["euler"]["wall"] for k in names},
          "ratio_cpu": {k: best[k]["cpu"] / best["euler"]["cpu"] for k in names}}


# ---------------------------------------------------------------------------------------------
# Health signals.

def bench_watch(char_gpt, every: int = 100, steps: int = 4, rounds: int = 5) -> dict:
  """Cost of `train.watch` at one watched step in `every`, on the loop bench's shrunk char_gpt
  (its config `char_gpt` at `LOOP_OVERRIDES`).

  Timed in alternation: the plain step (a), the step with the health vector on an unwatched
  step (c: the `lax.cond`'s branch and the vector's read-back) and on a watched one (b), and
  the detailed probe's forward (d). Per step, watching every K steps costs
    cheap:    ((K - 1) (c - a) + (b - a)) / (K a)        detailed: the same + d / (K a)
  """
  from jaxdl.bench.gpt import runner
  from jaxdl.config import variant_config
  from jaxdl.train import build, step as jstep, watch
  r = build(variant_config(char_gpt, {**LOOP_OVERRIDES, "train.steps": 100}))
  state = r.init_state()
  batch = {k: jnp.asarray(v) for k, v in
           next(r.ds.train_iter(process_index=0, process_count=1)).items()}

  def train_step(health):
    fn = jstep.make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key,
                               watch=health)
    return jax.jit(fn, donate_argnums=0)

  never = watch.make_health(state.params, r.model, 10 ** 9)[1]   # step + 1 never divisible
  always = watch.make_health(state.params, r.model, 1)[1]
  probe = jax.jit(watch.make_probe(r.model, r.task))
  runs = {name: runner(jax.tree.map(jnp.copy, state), fn, batch) for name, fn in (
      ("plain", train_step(None)), ("unwatched", train_step(never)),
      ("watched", train_step(always)), ("probe", lambda s, b: (s, probe(s, b))))}
  for run in runs.values():
    run(1)  # compile
  best = interleaved(runs, steps=steps, rounds=rounds)
  out = {"every": every}
  for clock, suffix in (("wall", ""), ("cpu", "_cpu")):  # CPU time: barely load-sensitive
    t = {k: v[clock] for k, v in best.items()}
    cheap = ((every - 1) * (t["unwatched"] - t["plain"]) + t["watched"] - t["plain"]) / (
        every * t["plain"])
    out.update({f"step_s{suffix}": t, f"cheap_overhead{suffix}": cheap,
                f"detailed_overhead{suffix}": cheap + t["probe"] / (every * t["plain"])})
  return out
