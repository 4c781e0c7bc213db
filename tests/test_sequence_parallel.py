"""Sequence parallelism (`parallel.sequence`, `jaxdl.models.ring_attention`) on 4 emulated CPU
devices (and 8 in one subprocess): ring and all-gather attention against full attention, the
causal ring's skipped blocks, packed documents across chunk boundaries, the same losses and
parameters as one device, checkpoints across sequence sizes (2 -> 1 -> 4), the bad inputs, and
`jaxdl bench --only sequence` at a tiny size.

The engine runs are tests/mesh_runs.py's tiny Llama-shaped GPT (8 query and 4 key/value heads
of width 4, SwiGLU, RoPE, one block, T = 16) through `jaxdl.train.run`, with its tolerance.
"""

import json
import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.data import packing
from jaxdl.models.attention import attention_reference, causal_mask
from jaxdl.models.gpt import GPT
from jaxdl.models.ring_attention import from_layout, sequence_attention, to_layout
from jaxdl.train import run, strategies
from jaxdl.train.chunked_loss import chunked_token_stats

import warm_python
from mesh_runs import FINAL_ONLY, STEPS, TINY
from mesh_runs import config as _config
from mesh_runs import resume as _resume
from mesh_runs import result as _result
from mesh_runs import same_as_one_device as _same_as_one_device
from mesh_runs import train as _train

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _spec(sequence, impl="ring", n=4):
  return strategies.make_strategy("jit", n, sequence=sequence,
                                  sequence_attention=impl).model_overrides["sequence"]


# ---------------------------------------------------------------------------------------------
# Attention alone.


def test_ring_and_allgather_equal_full_attention_and_the_causal_ring_skips_blocks():
  """fp32, to 1e-6: causal, non-causal, grouped-query (4 query heads on 2 key/value heads),
  sliding-window, packed-segment and Gemma-style (scaled, soft-capped, window off) attention,
  by the ring at S = 4 and all-gathered at S = 2 (x data 2), against `attention_reference` on
  the whole sequence. The ring's block counts are exact: 2 S + 1 per device causal, 4 S
  non-causal."""
  b, t, h, n, k = 2, 32, 4, 2, 8
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(keys[0], (b, t, h, k))
  kv = [jax.random.normal(kk, (b, t, n, k)) for kk in keys[1:]]
  seg = jnp.asarray(np.repeat([[0] * 9 + [1] * 14 + [2] * 9], b, 0))  # crosses chunks of 4
  cases = {"causal": dict(causal=True), "non_causal": dict(causal=False),
           "window": dict(causal=True, window=5), "packed": dict(causal=True, segment_ids=seg),
           # Gemma's: a layer whose window is off (local False), logits scaled and soft-capped
           "gemma": dict(causal=True, window=5, local=False, scale=0.3, softcap=2.0)}
  masks = {"causal": None, "non_causal": None, "window": causal_mask(t, window=5)[None, None],
           "packed": (seg[:, :, None] == seg[:, None, :])[:, None], "gemma": None}
  for s, impl in ((4, "ring"), (2, "allgather")):
    spec = _spec(s, impl)

    @jax.jit
    def split(q, k, v, spec=spec, s=s):
      out = {}
      for name, kw in cases.items():
        kw = dict(kw)
        if "local" in kw:
          kw["local"] = jnp.asarray(kw["local"])
        if "segment_ids" in kw:
          kw["segment_ids"] = to_layout(kw["segment_ids"], s)
        o, count = sequence_attention(to_layout(q, s), to_layout(k, s), to_layout(v, s), spec,
                                      count_blocks=True, **kw)
        out[name] = (from_layout(o, s), count)
      return out

    got = split(q, *kv)
    for name, kw in cases.items():
      want, _ = attention_reference(q, *kv, masks[name], causal=kw["causal"],
                                    scale=kw.get("scale"), softcap=kw.get("softcap", 0.0))
      np.testing.assert_allclose(got[name][0], want, atol=1e-6, rtol=1e-6, err_msg=name)
      if impl == "ring":
        blocks = 2 * s + 1 if kw["causal"] else 4 * s
        np.testing.assert_array_equal(got[name][1], [blocks] * s)


def test_chunked_loss_within_each_devices_positions_equals_the_plain_one():
  """`chunked_token_stats` with G = 2 groups (chunks cut within each half, one of 3 padded)
  gives the per-token statistics of one group, to 1e-6."""
  keys = jax.random.split(jax.random.PRNGKey(2), 3)
  h, w = jax.random.normal(keys[0], (2, 16, 8)), jax.random.normal(keys[1], (8, 11))
  y = jax.random.randint(keys[2], (2, 16), 0, 11)
  for got, want in zip(chunked_token_stats(h, w, y, 3, groups=2), chunked_token_stats(h, w, y, 16)):
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)


def test_packed_documents_across_chunk_boundaries_get_their_logits_alone():
  """A GPT (RoPE, 4 query heads on 2 key/value heads, a scanned stack of a windowed (W = 3) and
  a global layer, soft-capped attention logits) split over S = 4 devices (chunks of 2
  positions): three packed documents whose boundaries fall inside chunks and devices get the
  logits each gets run alone on one device, to 1e-5."""
  model = GPT(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
              pos="rope", sliding_window=3, attn_pattern="lg", attn_softcap=5.0)
  docs = [np.arange(1, 5), np.arange(7, 14), np.arange(20, 23)]  # with EOT: 5 + 8 + 3 = 16
  x = packing.join_documents(docs, 0)[None, :16].astype(np.int32)
  seg, positions = packing.segment_positions(x, 0)
  variables = model.init(jax.random.PRNGKey(1), jnp.asarray(x), train=False)
  split = model.clone(sequence=_spec(4))
  packed = jax.jit(lambda v, x, s, p: split.apply(v, x, train=False, segment_ids=s,
                                                  positions=p))(variables, x, seg, positions)
  starts = np.flatnonzero(np.diff(seg[0], prepend=-1))
  for lo, hi in zip(starts, list(starts[1:]) + [16]):
    alone = model.apply(variables, jnp.asarray(x[:, lo:hi]), train=False)
    np.testing.assert_allclose(packed[:, lo:hi], alone, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Through the engine.


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """One device from scratch; sequence 2 alone (2 devices), data 2 x sequence 2 (ring) and
  sequence 2 x tensor 2 (all-gather) resumed from its step 2, so each compiles one program."""
  assert jax.device_count() == 4
  tmp = tmp_path_factory.mktemp("sequence")
  out = {"one": _train(tmp / "one", "parallel.devices=1")}
  out["sequence"] = _resume(tmp / "one", 2, tmp / "sequence", "parallel.devices=2",
                            "parallel.sequence=2", *FINAL_ONLY)
  out["data_sequence"] = _resume(tmp / "one", 2, tmp / "data_sequence", "parallel.sequence=2")
  out["sequence_tensor"] = _resume(tmp / "one", 2, tmp / "sequence_tensor",
                                   "parallel.sequence=2", "parallel.tensor=2",
                                   "parallel.sequence_attention='allgather'", *FINAL_ONLY)
  return tmp, out


@pytest.mark.parametrize("name", ["sequence", "data_sequence", "sequence_tensor"])
def test_same_losses_and_parameters_as_one_device(runs, name):
  _, r = runs
  _same_as_one_device(r[name], r["one"])


def test_checkpoint_restores_across_sequence_sizes(runs):
  """2 -> 1 -> 4: sequence 2's checkpoint at step 4 resumed on one device, which saves step 5;
  that checkpoint resumed at sequence 4 (alone on the 4 devices) to the last step: the losses and
  parameters of the uninterrupted one-device run, each checkpoint naming the mesh it was saved
  from."""
  tmp, r = runs
  one_leg, four_leg = tmp / "sequence_2_to_1", tmp / "sequence_1_to_4"
  _resume(tmp / "data_sequence", 4, one_leg, "parallel.devices=1", "train.ckpt_every=1")
  shutil.copytree(one_leg, four_leg)
  shutil.rmtree(four_leg / "checkpoints" / str(STEPS))
  assert run(_config("parallel.sequence=4", *FINAL_ONLY), four_leg,
             progress=False)["start_step"] == STEPS - 1
  _same_as_one_device(_result(four_leg), r["one"])
  for workdir, step, sequence in ((tmp / "data_sequence", 4, 2), (one_leg, STEPS - 1, 1),
                                  (four_leg, STEPS, 4)):
    manifest = json.loads((workdir / "checkpoints" / str(step) / "manifest" / "metadata")
                          .read_text())
    assert manifest["mesh"].get("sequence", 1) == sequence, (workdir.name, step)


EIGHT = """
import sys
from jaxdl.config import load_config
from jaxdl.train import run
for i, sets in enumerate([["parallel.tensor=2", "parallel.sequence=4"],
                          ["parallel.tensor=2", "parallel.sequence=2", "train.loss_chunk=4"],
                          ["parallel.strategy='fsdp'", "parallel.fsdp=2", "parallel.tensor=2",
                           "parallel.sequence=2", "parallel.sequence_attention='allgather'"]]):
  config, _ = load_config("char_gpt:smoke", sys.argv[2:] + sets)
  run(config, f"{sys.argv[1]}/{i}", progress=False)
"""


def test_eight_devices_data_sequence_tensor(runs):
  """8 devices, one subprocess: sequence 4 x tensor 2; data 2 x sequence 2 x tensor 2 with the
  chunked loss (chunks of 4 within each device's 8 positions); fsdp 2 x sequence 2 x tensor 2
  with all-gathered keys and values."""
  tmp, r = runs
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": os.environ["XLA_FLAGS"].replace("device_count=4", "device_count=8")}
  workdir = tmp / "eight"
  proc = warm_python.run([sys.executable, "-c", EIGHT,
                          str(workdir), *TINY, *FINAL_ONLY], env=env, cwd=ROOT, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for i, mesh in enumerate(({"data": 1, "sequence": 4, "tensor": 2},
                            {"data": 2, "sequence": 2, "tensor": 2},
                            {"data": 1, "fsdp": 2, "sequence": 2, "tensor": 2})):
    manifest = json.loads((workdir / str(i) / "checkpoints" / str(STEPS) / "manifest" /
                           "metadata").read_text())
    assert manifest["device_count"] == 8 and manifest["mesh"] == mesh
    _same_as_one_device(_result(workdir / str(i)), r["one"])


@pytest.mark.parametrize("exp,sets,says", [
    ("char_gpt:smoke", ["parallel.sequence=3"], "does not divide the 4 devices"),
    ("char_gpt:smoke", ["parallel.sequence=4", "data.context_length=12"],
     "do not divide its length 12"),
    ("char_gpt:smoke", ["parallel.sequence=2", "model.mixer='ssm'"], "mixer='ssm'"),
    ("char_gpt:smoke", ["parallel.sequence=2", "parallel.strategy='pmap'"], "'pmap'"),
    ("digits_lstm:smoke", ["parallel.sequence=2"], "'lstm' is a recurrence"),
    ("digits_cnn:smoke", ["parallel.sequence=2"], "'cnn' is not a GPT"),
])
def test_bad_sequence_config_is_one_line_exit_2(exp, sets, says, tmp_path, capsys):
  argv = ["train", exp, "--workdir", str(tmp_path / "w"), "--no-progress"]
  for s in (TINY if exp.startswith("char_gpt") else []) + sets:
    argv += ["--set", s]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "parallel.sequence" in err[0] and says in err[0], err
  assert not (tmp_path / "w").exists()


def test_sequence_bench_runs_at_a_tiny_size():
  """`jaxdl bench --only sequence`'s measurement at T = 32 on S = 2: the per-device bytes,
  a step time, the chunked loss's bytes and the ring's block counts (5 causal, 8 not)."""
  from jaxdl.bench import sequence
  r = sequence.measure(seqs=(2,), model_fields=dict(d_model=16, n_head=2, n_layer=1,
                                                      vocab_size=64, block_size=32),
                       seq=32, chunk=8, steps=1)
  m = r["by_sequence"][2]
  assert m["temp"] > 0 and m["temp_chunk"] > 0 and m["step_s"] > 0
  assert (r["ring"]["causal"]["blocks_per_device"],
          r["ring"]["non_causal"]["blocks_per_device"]) == (5, 8)
