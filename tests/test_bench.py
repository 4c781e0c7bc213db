"""`jaxdl bench` plumbing (nothing here is timed): option parsing, the FLOP count, the table, and
that the plain-Flax baseline is the same model as jaxdl's GPT (same parameter count)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from jaxdl import bench
from jaxdl.cli import bench as bench_cli
from jaxdl.bench import gpt as bgpt
from jaxdl.bench import registry


def test_only_accepts_lists_and_rejects_unknown_names():
  assert bench_cli.selected([]) == list(bench.BENCHES)
  assert bench_cli.selected(["loop,gpt", "data"]) == ["gpt", "loop", "data"]
  with pytest.raises(ValueError, match="--only: unknown benchmark 'gtp'"):
    bench_cli.selected(["gtp"])


def test_baseline_and_jaxdl_gpt_have_the_same_parameters():
  setup = dataclasses.replace(bgpt.CPU_SETUP, context=16, d_model=32, n_head=4, n_layer=2)
  x = jnp.zeros((1, setup.context), jnp.int32)
  count = lambda tree: sum(a.size for a in jax.tree.leaves(tree))  # noqa: E731
  base = jax.eval_shape(bgpt.BaselineGPT(setup).init, jax.random.PRNGKey(0), x)
  ours = jax.eval_shape(lambda k: bgpt.jaxdl_model(setup).init(k, x, train=False),
                        jax.random.PRNGKey(0))
  d, v, t, layers = setup.d_model, setup.vocab, setup.context, setup.n_layer
  # ln_1, c_attn (qkv), attention output, ln_2, c_fc, c_proj
  per_layer = (2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d)
               + (4 * d * d + d))
  expected = v * d + t * d + layers * per_layer + 2 * d  # wte, wpe, blocks, ln_f (tied head)
  assert count(ours) == expected
  assert count(base) == expected


def test_flops_per_token_is_6n_plus_attention():
  s = bgpt.CPU_SETUP
  n = 3_000_000
  assert bgpt.flops_per_token(s, n) == 6 * n + 12 * 4 * 256 * 256


def test_table_lists_every_row_with_its_verdict():
  rows = [registry._row("gpt", "tokens/s", 120.0, 100.0, 1.2, ">= 1.2", True),
          registry._row("loop", "steps/s", 9.0, 10.0, 0.9, "overhead <= 5%", False)]
  lines = bench_cli.format_table(rows).splitlines()
  assert lines[0].split() == ["bench", "measure", "jaxdl", "baseline", "ratio", "target", "met"]
  assert lines[2].split()[-1] == "yes" and lines[3].split()[-1] == "NO"


@pytest.mark.slow
def test_the_gpu_bench_path_runs_in_bf16_at_toy_size():
  """What scripts/gpu_check.sh runs on a GPU (bf16 compute, fp32 params, both steps, MFU),
  end to end at toy size on the CPU, so a dtype slip cannot first show up on the GPU."""
  setup = dataclasses.replace(bgpt.GPU_SETUP, batch=2, context=16, vocab=64, d_model=16,
                              n_layer=1, n_head=2, peak_n=32)
  assert setup.dtype == "bfloat16"
  r = bgpt.bench_gpt(setup, steps=1, rounds=1)
  for name in ("jaxdl", "jaxdl_unrolled", "baseline"):
    assert r[name]["tokens_per_s"] > 0 and 0 < r[name]["mfu"] < float("inf"), name
    assert math.isfinite(r[name]["loss"]), name           # the bf16 steps train
    assert r[name]["param_dtypes"] == ["float32"], name   # master weights stay fp32


def test_the_readme_copies_the_whole_bench_time_from_the_bench_docstring():
  """One number, one place: the whole bench's measured seconds and CPU seconds."""
  import pathlib
  import re
  readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
  pattern = r"whole bench[^.]*? took (\d+) s \(about (\d+) minutes, ([\d,]+) CPU-s\)"
  stated = re.search(pattern, " ".join(bench.__doc__.split()))
  copied = re.search(pattern, " ".join(readme.split()), flags=re.I)
  assert stated and copied and copied.groups() == stated.groups()


def test_the_startup_bench_alternates_its_two_processes_and_keeps_each_best(monkeypatch):
  """`jaxdl bench --only startup`'s bookkeeping with the processes' CPU seconds given (the
  timing itself is the bench's, not the suite's): the frozen program and the unfrozen baseline
  alternate, each in a fresh workdir; each keeps its best; ratio = frozen / unfrozen; the row
  says whether the freeze paid."""
  from jaxdl.bench import startup
  calls, seconds = [], iter([5.0, 8.0, 4.0, 9.0])

  def timed(argv):
    calls.append(argv)
    return next(seconds)

  monkeypatch.setattr(startup, "_timed", timed)
  r = startup.bench_startup(("moons_mlp:smoke",), rounds=2)
  assert r == {"moons_mlp:smoke": {"frozen": 4.0, "unfrozen": 8.0, "ratio": 0.5}}
  assert [argv[1:3] for argv in calls] == [["-m", "jaxdl"], ["-c", startup._UNFROZEN]] * 2
  assert all(argv[3:5] == ["train", "moons_mlp:smoke"] for argv in calls)
  assert len({argv[argv.index("--workdir") + 1] for argv in calls}) == 4
  monkeypatch.setattr(startup, "bench_startup", lambda: r)
  _, (row,) = bench.REGISTRY["startup"]({})
  assert (row["jaxdl"], row["baseline"], row["ratio"], row["met"]) == (4.0, 8.0, 0.5, True)


def test_the_readme_copies_the_accum_rows_from_the_bench_docstring():
  """One number, one place: each family's wall / CPU ratios and memory ratio in the README's
  `accum` row are the ones `jaxdl.bench.cnn` states it measured."""
  import pathlib
  import re
  from jaxdl.bench import cnn
  readme = " ".join((pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
                    .split())
  stated = dict((name, (wall, cpu, mem)) for name, wall, cpu, mem in re.findall(
      r"^\s+(\w+)\s+scan\S*\s+([\d.]+) / ([\d.]+)\s+([\d.]+)x", cnn.__doc__, flags=re.M))
  names = {"digits_cnn": "digits CNN", "digits_mlp_bn": "MLP \\+ BatchNorm",
           "char_gpt": "char_gpt", "unet": "U-Net"}
  assert sorted(stated) == sorted(cnn.ACCUM_FAMILIES) == sorted(names)
  for family, (wall, cpu, mem) in stated.items():
    copied = re.search(rf"{names[family]} ([\d.]+)x / ([\d.]+)x \(([\d.]+)x\)", readme)
    assert copied and copied.groups() == (wall, cpu, mem), family


def test_the_readme_copies_the_xla_cpu_gain_from_the_seam_docstring():
  """One number, one place: the user's-run step seconds with and without the XLA:CPU
  workarounds, as `jaxdl.train.xla_cpu` states them, are the README's `xla_cpu` row."""
  import pathlib
  import re
  from jaxdl.train import xla_cpu
  readme = " ".join((pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
                    .split())
  stated = re.search(r"step\s+([\d.]+) s with the rewrite vs ([\d.]+) s without: ([\d.]+)x",
                     " ".join(xla_cpu.__doc__.split()))
  assert stated, "the seam's docstring states no user-run gain"
  with_s, without_s, ratio = stated.groups()
  assert f"{with_s} vs {without_s} s a step, {ratio}x" in readme
  assert float(ratio) < 0.9  # the bar a workaround must clear to stay


def test_the_memory_bench_rows_and_the_readme_copy_its_docstring(monkeypatch):
  """`jaxdl bench --only memory`'s rows from given bytes (the compiles are the bench's, not the
  suite's): each variant over the plain step, and the chunked loss's saving over the logits'
  bytes; the README states the ratios the bench docstring says it measured."""
  import pathlib
  import re
  from jaxdl.bench import memory
  logits = memory.ROWS * memory.SEQ * memory.MODEL["vocab_size"] * 4
  r = {"model": memory.MODEL, "seq": memory.SEQ, "chunk": memory.CHUNK, "backend": "cpu",
       "logits_bytes": logits,
       "by_variant": {"plain": {"temp": 4 * logits}, "chunked loss": {"temp": 3 * logits},
                      "remat full": {"temp": 5 * logits}}}
  monkeypatch.setattr(memory, "bench_memory", lambda: r)
  _, rows = bench.REGISTRY["memory"]({})
  assert [(row["ratio"], row["met"]) for row in rows] == [(0.75, True), (1.25, False),
                                                          (1.0, True)]
  stated = dict(re.findall(r"^  (remat \w+|chunked loss)\s+([\d.]+)x", memory.__doc__, re.M))
  assert sorted(stated) == ["chunked loss", "remat dots", "remat dots_no_batch", "remat full"]
  readme = " ".join((pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
                    .split())
  saved = re.search(r"chunked loss\s+[\d.]+x\s+\(saves [\d.]+ GB: ([\d.]+)x", memory.__doc__)[1]
  assert (f"`train.loss_chunk=512` {stated['chunked loss']}x (saves {saved}x the logits' bytes); "
          f"`model.remat` full {stated['remat full']}x, dots {stated['remat dots']}x, "
          f"dots_no_batch {stated['remat dots_no_batch']}x") in readme
