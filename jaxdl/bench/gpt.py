"""GPT train-step throughput against a plain-Flax baseline, MFU, and compile time vs depth.

Model FLOPs per token (PaLM appendix B, the count nanoGPT and llm.c report MFU with):
  F = 6 N + 12 L D T
N the parameters touched by matmuls (all but the position table wpe; the tied wte counts once,
as the head), L layers, D width, T context: 6 N for the forward and backward matmuls, 12 L D T
for the attention scores and the weighted sum. Model FLOP/s = F x tokens/s; MFU = model FLOP/s
over the peak, a large matmul timed on the same device in the same run (not a datasheet number).

The baseline is written the way the flax examples (lm1b, wmt) write a decoder: an `nn.Module`
per block with `nn.MultiHeadDotProductAttention` on an `nn.make_causal_mask` mask, the blocks
unrolled in a Python loop, `flax.training.train_state.TrainState` with `optax.chain(clip,
adamw)`, and a `jax.jit` step without donation.

Shapes: B batch, T context, D width, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from jaxdl import models as jmodels
from jaxdl import optim as joptim
from jaxdl.bench.timing import Clock, interleaved
from jaxdl.config import base_config
from jaxdl.models import gpt as jgpt
from jaxdl.train import step as jstep
from jaxdl.train import tasks
from jaxdl.train.step import create_train_state
from jaxdl.train.throughput import measure_peak, transformer_flops_per_token


@dataclasses.dataclass(frozen=True)
class GPTSetup:
  """The benchmarked model: the issue's CPU model, or GPT-2 small in bf16 on a GPU."""
  name: str
  batch: int
  context: int
  vocab: int
  d_model: int
  n_layer: int
  n_head: int
  dtype: str  # compute dtype; params stay fp32
  peak_n: int  # side of the square matmul timed as the peak
  # jaxdl's layers per scan iteration in the timed step (params stay stacked under 'h'):
  # unrolling the scan saves the per-iteration slicing and stacking of params, residuals and
  # gradients, which is a visible share of a small model's step on a CPU.
  scan_unroll: int = 1

  @property
  def tokens(self) -> int:
    return self.batch * self.context


CPU_SETUP = GPTSetup("d256-L4-T256", batch=16, context=256, vocab=256, d_model=256, n_layer=4,
                     n_head=4, dtype="float32", peak_n=2048, scan_unroll=4)
GPU_SETUP = GPTSetup("gpt2-small", batch=16, context=1024, vocab=50257, d_model=768, n_layer=12,
                     n_head=12, dtype="bfloat16", peak_n=8192)


def default_setup() -> GPTSetup:
  return GPU_SETUP if jax.default_backend() == "gpu" else CPU_SETUP


# ---------------------------------------------------------------------------------------------
# FLOPs per token; the peak is a large matmul on the same device (`throughput.measure_peak`).

def flops_per_token(setup: GPTSetup, n_params_matmul: int) -> float:
  return transformer_flops_per_token(n_params_matmul, setup.n_layer, setup.d_model,
                                     setup.context)


# ---------------------------------------------------------------------------------------------
# The plain-Flax baseline.

class BaselineBlock(nn.Module):
  d_model: int
  n_head: int
  dtype: str = "float32"

  @nn.compact
  def __call__(self, x_BxTxD, mask):
    init = nn.initializers.normal(0.02)
    y = nn.LayerNorm(dtype=self.dtype)(x_BxTxD)
    y = nn.MultiHeadDotProductAttention(num_heads=self.n_head, qkv_features=self.d_model,
                                        kernel_init=init, dtype=self.dtype,
                                        deterministic=True)(y, mask=mask)
    x_BxTxD = x_BxTxD + y
    y = nn.LayerNorm(dtype=self.dtype)(x_BxTxD)
    y = nn.gelu(nn.Dense(4 * self.d_model, kernel_init=init, dtype=self.dtype)(y))
    return x_BxTxD + nn.Dense(self.d_model, kernel_init=init, dtype=self.dtype)(y)


class BaselineGPT(nn.Module):
  setup_: GPTSetup

  @nn.compact
  def __call__(self, tokens_BxT):
    s = self.setup_
    embed = nn.Embed(s.vocab, s.d_model, embedding_init=nn.initializers.normal(0.02),
                     dtype=s.dtype)
    pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, s.context, s.d_model))
    x_BxTxD = embed(tokens_BxT) + pos[:, :tokens_BxT.shape[1]].astype(s.dtype)
    mask = nn.make_causal_mask(tokens_BxT)
    for _ in range(s.n_layer):
      x_BxTxD = BaselineBlock(s.d_model, s.n_head, s.dtype)(x_BxTxD, mask)
    x_BxTxD = nn.LayerNorm(dtype=s.dtype)(x_BxTxD)
    return embed.attend(x_BxTxD).astype(jnp.float32)


def baseline_step(setup: GPTSetup):
  """(state, jitted step) of the plain-Flax baseline."""
  model = BaselineGPT(setup)
  params = jax.jit(model.init)(jax.random.PRNGKey(0),
                               jnp.zeros((1, setup.context), jnp.int32))["params"]
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

  @jax.jit
  def train_step(state, batch):
    def loss_fn(params):
      logits = state.apply_fn({"params": params}, batch["x"])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  return state, train_step


# ---------------------------------------------------------------------------------------------
# jaxdl's step: the engine's own pieces, as `jaxdl train` builds them.

def jaxdl_model(setup: GPTSetup, **overrides):
  cfg = jgpt.gpt_config(vocab_size=setup.vocab, block_size=setup.context, n_layer=setup.n_layer,
                        n_head=setup.n_head, d_model=setup.d_model, **overrides)
  return jmodels.build_model(cfg).clone(dtype=jnp.dtype(setup.dtype))


def jaxdl_step(setup: GPTSetup, *, abstract: bool = False, **overrides):
  """(state, step) for jaxdl's GPT: scanned blocks, fused qkv, attention 'auto', the lm task
  loss, AdamW + clipping from `jaxdl.optim`, state donated."""
  model = jaxdl_model(setup, **overrides)
  config = base_config()
  config.task = "lm"
  task = tasks.make_task(config)
  tx, schedule = joptim.make_optimizer(joptim.default_optim_config(), 1000)
  example = jnp.zeros((1, setup.context), jnp.int32)
  init = lambda k: create_train_state(model, tx, k, example)  # noqa: E731
  key = jax.random.PRNGKey(0)
  state = jax.eval_shape(init, key) if abstract else jax.jit(init)(key)
  step = jstep.make_train_step(model.apply, task.loss_fn, tx, schedule, jax.random.PRNGKey(1))
  return state, jax.jit(step, donate_argnums=0)


def random_batch(setup: GPTSetup, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, setup.vocab, (setup.batch, setup.context + 1)).astype(np.int32)
  return {"x": jnp.asarray(tokens[:, :-1]), "y": jnp.asarray(tokens[:, 1:])}


def runner(state, step: Callable, batch: dict):
  """A `run(n) -> Clock` that advances its own copy of the state by n steps; `run.last` is
  (state, step output) after the latest call."""
  holder = [state]

  def run(n: int) -> Clock:
    with Clock() as clock:
      s = holder[0]
      for _ in range(n):
        s, out = step(s, batch)
      jax.block_until_ready(out)
    holder[0] = s
    run.last = (s, out)
    return clock

  return run


def bench_gpt(setup: GPTSetup, *, steps: int | None = None, rounds: int = 5) -> dict:
  """tokens/s, model FLOP/s and MFU of jaxdl's step and the baseline, timed in alternation.

  tokens/s and MFU use wall time; `cpu_step_s` (process CPU time per step) is kept beside it
  as the load-insensitive comparison on a shared machine.
  """
  steps = steps or (10 if jax.default_backend() == "gpu" else 2)
  batch = random_batch(setup)
  j_state, j_step = jaxdl_step(setup, scan_unroll=setup.scan_unroll)
  u_state, u_step = jaxdl_step(setup, scan_layers=False)
  b_state, b_step = baseline_step(setup)
  n_params = sum(x.size for x in jax.tree.leaves(j_state.params))
  n_matmul = n_params - setup.context * setup.d_model  # minus wpe
  compiled, compile_s = {}, {}
  for k, (state, step) in {"jaxdl": (j_state, j_step), "jaxdl_unrolled": (u_state, u_step),
                           "baseline": (b_state, b_step)}.items():
    t = time.perf_counter()  # lower + compile: what a user waits for before step 1
    compiled[k] = (state, step.lower(state, batch).compile())
    compile_s[k] = time.perf_counter() - t
  runs = {k: runner(state, fn, batch) for k, (state, fn) in compiled.items()}
  first = {k: run(1).wall for k, run in runs.items()}  # one step, the first
  per_step = interleaved(runs, steps=steps, rounds=rounds)
  peak = measure_peak(setup.peak_n, setup.dtype)
  fpt = flops_per_token(setup, n_matmul)
  out = {"setup": dataclasses.asdict(setup), "params": n_params, "flops_per_token": fpt,
         "peak_flops": peak, "first_call_s": first, "compile_s": compile_s, "steps": steps,
         "rounds": rounds}
  for k, sec in per_step.items():
    tps = setup.tokens / sec["wall"]
    state, metrics = runs[k].last
    loss = metrics["loss"] if isinstance(metrics, dict) else metrics
    out[k] = {"step_s": sec["wall"], "cpu_step_s": sec["cpu"], "tokens_per_s": tps,
              "compile_s": compile_s[k],
              "model_flops": tps * fpt, "mfu": tps * fpt / peak, "loss": float(loss),
              "param_dtypes": sorted({str(a.dtype) for a in jax.tree.leaves(state.params)})}
  return out


# ---------------------------------------------------------------------------------------------
# Compile time vs depth.

COMPILE_SETUP = GPTSetup("compile", batch=2, context=32, vocab=256, d_model=64, n_layer=0,
                         n_head=4, dtype="float32", peak_n=0)


def compile_seconds(n_layer: int, scan: bool) -> float:
  """Trace + lower + compile of the full train step (what a user waits for before step 1)."""
  setup = dataclasses.replace(COMPILE_SETUP, n_layer=n_layer)
  state, step = jaxdl_step(setup, abstract=True, scan_layers=scan)
  batch = jax.eval_shape(lambda: random_batch(setup))
  t = time.perf_counter()
  step.lower(state, batch).compile()
  return time.perf_counter() - t


def bench_compile(depths=(2, 8, 24)) -> dict:
  return {("scan" if scan else "unrolled"): {d: compile_seconds(d, scan) for d in depths}
          for scan in (True, False)}
