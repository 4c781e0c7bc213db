"""Benches of the newer GPT blocks: a mixture of experts against the dense MLP of the same active
compute, and the state-space mixer against attention as T grows.

  moe  train-step seconds of a GPT whose MLPs are E = 8 experts of width F = 4D with top-2
       routing (capacity 1.25) vs the same GPT with one dense MLP of width 2F = 8D (the FLOPs of
       two experts per token, `jaxdl.models.costs.gpt_costs`); target <= 1.5x.
  moe_dispatch  forward + backward seconds of one MoE layer's routing, dispatch, experts and
       combine at N = B T tokens: the index dispatch `jaxdl.models.moe` uses (scatter to an
       (E, C, D) buffer, gather back: O(N K D) movement) vs a one-hot (N, E, C) dispatch einsum
       (Switch/GShard style: O(N E C D) = O(cf K N^2 D)); the same routes, outputs checked equal.
  ssm  train-step seconds at T = 128, 256, 512, 1024 (B T = 4096 tokens per step) of mixer='ssm'
       and of attention; the SSM's step time per token stays flat in T while attention's grows
       (its scores are T x T).

Both time the real `jaxdl.train.step.make_train_step` of the lm task (AdamW) with
`jaxdl.bench.timing.interleaved`, so the two contenders share the machine's load.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxdl.bench.timing import Clock, interleaved
from jaxdl.models import build_model, gpt_config
from jaxdl.models import moe
from jaxdl.models.costs import gpt_costs
from jaxdl.train import step as jstep
from jaxdl.train import tasks
from jaxdl.train.step import create_train_state


def _step_runner(model_cfg, batch: int, seq: int):
  """`run(n) -> Clock`: n jitted train steps of the GPT `model_cfg` on random tokens."""
  model = build_model(model_cfg)
  tx = optax.adamw(1e-3)
  task = tasks.make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  train_step = jstep.make_train_step(model.apply, task.loss_fn, tx, lambda s: 1e-3,
                                     jax.random.PRNGKey(0), jit=True)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, model.vocab_size)
  data = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
  holder = [create_train_state(model, tx, jax.random.PRNGKey(2), data["x"][:1])]
  holder[0], m = train_step(holder[0], data)  # compile
  jax.block_until_ready(m)

  def run(n: int) -> Clock:
    with Clock() as c:
      for _ in range(n):
        holder[0], m = train_step(holder[0], data)
      jax.block_until_ready(m)
    return c

  return run, model


def bench_moe(d: int = 128, layers: int = 4, seq: int = 64, batch: int = 32, steps: int = 5,
              rounds: int = 3) -> dict:
  """MoE E=8, k=2 vs the dense GPT of the same active compute (module docstring)."""
  sizes = dict(vocab_size=256, block_size=seq, n_layer=layers, n_head=4, d_model=d)
  moe_cfg = gpt_config("", moe_experts=8, moe_top_k=2, **sizes)
  dense_cfg = gpt_config("", mlp_hidden=8 * d, use_bias=False, **sizes)
  runs, costs = {}, {}
  for name, cfg in (("moe", moe_cfg), ("dense", dense_cfg)):
    runs[name], model = _step_runner(cfg, batch, seq)
    costs[name] = gpt_costs(model, seq)
  best = interleaved(runs, steps=steps, rounds=rounds)
  return {"step_s": {k: v["wall"] for k, v in best.items()},
          "cpu_step_s": {k: v["cpu"] for k, v in best.items()}, "costs": costs}


def bench_ssm(d: int = 64, layers: int = 2, tokens: int = 4096,
              lengths: tuple[int, ...] = (128, 256, 512, 1024), steps: int = 3,
              rounds: int = 2) -> dict:
  """Seconds per train step of mixer='ssm' and attention at each T, B T = `tokens`."""
  out = {"ssm": {}, "attention": {}}
  for t in lengths:
    runs = {}
    for mixer in out:
      cfg = gpt_config("", vocab_size=256, block_size=t, n_layer=layers, n_head=4, d_model=d,
                       mixer=mixer, pos="rope")
      runs[mixer], _ = _step_runner(cfg, tokens // t, t)
    best = interleaved(runs, steps=steps, rounds=rounds)
    for mixer in out:
      out[mixer][t] = best[mixer]["cpu"]
  # Growth of each contender's step time from the shortest to the longest T (same tokens/step).
  out["growth"] = {m: out[m][lengths[-1]] / out[m][lengths[0]] for m in ("ssm", "attention")}
  out["lengths"] = list(lengths)
  return out



def _moe_layer(dispatch: str, spec: moe.MoeSpec, capacity: int):
  """loss(x, w_r, w1, w2) = sum y^2 of one MoE layer with `dispatch` 'index' or 'onehot'."""

  def layer(x_NxD, w_r, w1_ExDxF, w2_ExFxD):
    expert_KxN, slot_KxN, gate_KxN, kept_KxN, _ = moe.route(x_NxD @ w_r, spec, capacity)
    gelu = lambda a: jax.nn.gelu(a, approximate=True)  # noqa: E731
    experts = lambda buf_ExCxD: jnp.einsum("ecf,efd->ecd", gelu(  # noqa: E731
        jnp.einsum("ecd,edf->ecf", buf_ExCxD, w1_ExDxF)), w2_ExFxD)
    if dispatch == "index":  # as in jaxdl.models.moe.MoeMlp
      n, d = x_NxD.shape
      buf = jnp.zeros((spec.experts, capacity, d)).at[expert_KxN, slot_KxN].set(
          jnp.broadcast_to(x_NxD, (spec.top_k, n, d)), mode="drop")
      y_KxNxD = experts(buf)[expert_KxN, jnp.minimum(slot_KxN, capacity - 1)]
      return jnp.einsum("kn,knd->nd", gate_KxN * kept_KxN, y_KxNxD)
    # One-hot: d[n, e, c] = 1 iff a kept choice of token n sits at slot c of expert e (a slot
    # past the capacity one-hots to zeros).
    d_KxNxExC = (jax.nn.one_hot(expert_KxN, spec.experts)[..., None] *
                 jax.nn.one_hot(slot_KxN, capacity)[..., None, :] * kept_KxN[..., None, None])
    combine_NxExC = jnp.einsum("kn,knec->nec", gate_KxN, d_KxNxExC)
    out_ExCxD = experts(jnp.einsum("nec,nd->ecd", d_KxNxExC.sum(0), x_NxD))
    return jnp.einsum("nec,ecd->nd", combine_NxExC, out_ExCxD)

  return layer


def bench_moe_dispatch(d: int = 128, experts: int = 8, top_k: int = 2,
                       tokens: tuple[int, ...] = (512, 2048), steps: int = 5,
                       rounds: int = 3) -> dict:
  """Seconds per forward + backward of the index and one-hot dispatch at each N (docstring)."""
  spec = moe.MoeSpec(experts, top_k, 1.25)
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  w = (jax.random.normal(keys[1], (d, experts)) * 0.1,
       jax.random.normal(keys[2], (experts, d, 4 * d)) * d ** -0.5,
       jax.random.normal(keys[3], (experts, 4 * d, d)) * (4 * d) ** -0.5)
  out = {"index": {}, "onehot": {}}
  for n in tokens:
    x_NxD = jax.random.normal(keys[0], (n, d))
    layers_ = {k: _moe_layer(k, spec, spec.capacity(n)) for k in out}
    ys = [np.asarray(jax.jit(f)(x_NxD, *w)) for f in layers_.values()]
    np.testing.assert_allclose(ys[0], ys[1], rtol=1e-4, atol=1e-4)  # the same computation
    runs = {}
    for k, f in layers_.items():
      grad = jax.jit(jax.grad(lambda *a, f=f: jnp.square(f(*a)).sum(), argnums=(0, 1, 2, 3)))
      jax.block_until_ready(grad(x_NxD, *w))  # compile

      def run(m: int, grad=grad, x_NxD=x_NxD) -> Clock:
        with Clock() as c:
          for _ in range(m):
            g = grad(x_NxD, *w)
          jax.block_until_ready(g)
        return c

      runs[k] = run
    best = interleaved(runs, steps=steps, rounds=rounds)
    for k in out:
      out[k][n] = best[k]["cpu"]
  out["ratio"] = {n: out["onehot"][n] / out["index"][n] for n in tokens}
  out["tokens"] = list(tokens)
  return out
