"""MFU for every model: the matmul FLOPs of a train step counted from its jaxpr
(`jaxdl.train.throughput.matmul_flops`), with dropout, scanned layers and gradient accumulation,
against closed forms, the GPT formula and each other; and `jaxdl train` writing `mfu` records."""

import jax
import jax.numpy as jnp
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.train import build, make_train_step, throughput
from jaxdl.train.writers import read_metrics

GPT = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "data.batch_size=8",
       "data.context_length=16", "model.block_size=16"]


def _count(experiment: str, *overrides: str) -> tuple[float | None, str]:
  """`count_step_flops` of the experiment's train step, traced on abstract state (no compile)."""
  config, _ = load_config(experiment, ["parallel.devices=1", *overrides])
  r = build(config)
  step = jax.jit(make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key,
                                 grad_accum=r.train.grad_accum))
  batch = {k: jnp.asarray(v) for k, v in next(r.ds.train_iter()).items()}
  return throughput.count_step_flops(r, step, r.abstract_state(), batch)


def _gpt_jaxpr_flops(*overrides: str) -> tuple[float, float]:
  """(the jaxpr count, the 6N + 12LDT formula) of a tiny char_gpt step."""
  config, _ = load_config("char_gpt", ["parallel.devices=1", *GPT, *overrides])
  r = build(config)
  step = make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, r.base_key)
  batch = {k: jnp.asarray(v) for k, v in next(r.ds.train_iter()).items()}
  jaxpr = jax.make_jaxpr(step)(r.abstract_state(), batch)
  formula, _ = throughput.count_step_flops(r, None, None, batch)
  return throughput.matmul_flops(jaxpr), formula


def test_the_cnn_step_counts_its_closed_form():
  """digits_cnn (dropout 0.1) at batch 128: 8x8x1 -conv 3x3-> 32 -pool-> 4x4 -conv-> 64 -pool->
  2x2x64 -> 128 -> 10. Forward multiply-adds per digit count only taps on real pixels (a 3-tap
  window, padding 1, over n positions hits 3n - 2 of them per axis): conv0 32 (22^2), conv1
  64 x 32 (10^2), dense 256 x 128, head 128 x 10. The backward pass repeats each for the kernel
  gradient and each but conv0 for the input gradient (the pixels take no gradient)."""
  conv0, conv1, dense, head = 32 * 22 ** 2, 64 * 32 * 10 ** 2, 256 * 128, 128 * 10
  forward = conv0 + conv1 + dense + head
  flops, how = _count("digits_cnn")
  assert flops == 2 * 128 * (3 * forward - conv0) and "jaxpr" in how


def test_dropout_scanned_layers_and_microbatches_leave_the_count_unchanged():
  """Dropout's random bits are no matmuls (and no loop in the jaxpr, where XLA:CPU makes one);
  a scan over layers or microbatches counts its body once per iteration."""
  base, _ = _count("digits_mlp", "model.dropout=0.0")
  assert base == _count("digits_mlp")[0] == _count("digits_mlp", "train.grad_accum=4")[0]
  scanned, _ = _count("digits_vit")
  assert scanned == _count("digits_vit", "model.scan_layers=False")[0] > 0
  unet, how = _count("fm_digits_cfg")
  assert unet > 0, how


def test_the_gpt_jaxpr_count_meets_the_formula_with_and_without_dropout():
  """The formula `jaxdl bench gpt` and the log use (6N + 12LDT) vs the jaxpr's matmuls: N also
  holds the LayerNorm and bias parameters, which are no matmuls, so the jaxpr count is a little
  lower; dropout changes nothing."""
  off, formula = _gpt_jaxpr_flops("model.dropout=0.0")
  on, _ = _gpt_jaxpr_flops("model.dropout=0.1")
  assert on == off
  assert 0.9 * formula <= off <= formula


def test_a_while_loop_around_matmuls_is_named_as_the_reason():
  def step(w, x):
    return jax.lax.while_loop(lambda c: jnp.sum(c[1]) < 10.0, lambda c: (c[0], c[0] @ c[1]),
                              (w, x))

  jaxpr = jax.make_jaxpr(step)(jnp.ones((4, 4)), jnp.ones(4))
  with pytest.raises(throughput.NotCountable, match=r"lax.while_loop around matmuls.*test_mfu"):
    throughput.matmul_flops(jaxpr)


def test_train_digits_cnn_smoke_writes_mfu(tmp_path):
  workdir = tmp_path / "w"
  assert cli.main(["train", "digits_cnn:smoke", "--workdir", str(workdir), "--no-progress",
                   "--set", "train.peak_flops=1e12", "--set", "train.eval_every=0"]) == 0
  rates = read_metrics(workdir, "throughput")
  assert rates and all(r["mfu"] > 0 for r in rates)
  # The global step's count (4 emulated devices, one batch of 128): the closed form above.
  flops = rates[-1]["flops_per_s"] / rates[-1]["steps_per_s"]
  assert flops == pytest.approx(_count("digits_cnn")[0], rel=1e-9)
