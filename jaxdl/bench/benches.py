"""The benchmarks, one `@register_bench` function each, in the order they run; what each
measures and its target is listed in `jaxdl.bench`. Each imports jax and its measurement module
when it runs, so `BENCHES` (the names) loads no jax.
"""

from __future__ import annotations

from jaxdl.bench.registry import REGISTRY, _row, register_bench

@register_bench("gpt")
def _gpt(ctx):
  from jaxdl.bench import gpt
  setup, on_gpu = ctx["setup"], ctx["on_gpu"]
  r = gpt.bench_gpt(setup)
  j, b, u = r["jaxdl"], r["baseline"], r["jaxdl_unrolled"]
  ctx["step_s"] = j["step_s"]
  return r, [
      _row("gpt", f"tokens/s ({setup.name}, {setup.dtype})", j["tokens_per_s"],
           b["tokens_per_s"], j["tokens_per_s"] / b["tokens_per_s"], ">= 1.2",
           j["tokens_per_s"] / b["tokens_per_s"] >= 1.2, "tok/s"),
      _row("gpt", "tokens/s, jaxdl with unrolled layers (scan_layers=False)",
           u["tokens_per_s"], b["tokens_per_s"], u["tokens_per_s"] / b["tokens_per_s"],
           ">= 1.2", u["tokens_per_s"] / b["tokens_per_s"] >= 1.2, "tok/s"),
      _row("gpt", "tokens/s, scanned vs unrolled layers", j["tokens_per_s"],
           u["tokens_per_s"], j["tokens_per_s"] / u["tokens_per_s"], ">= 0.95" if on_gpu else "",
           (j["tokens_per_s"] / u["tokens_per_s"] >= 0.95) if on_gpu else None, "tok/s"),
      _row("gpt", f"compile seconds, scanned vs unrolled ({setup.n_layer} layers; baseline "
           f"{b['compile_s']:.1f})", j["compile_s"], u["compile_s"],
           j["compile_s"] / u["compile_s"], "", None, "s"),
      _row("gpt", "CPU seconds per step, baseline / jaxdl (load-insensitive)",
           j["cpu_step_s"], b["cpu_step_s"], b["cpu_step_s"] / j["cpu_step_s"], ">= 1.2",
           b["cpu_step_s"] / j["cpu_step_s"] >= 1.2, "s"),
      _row("gpt", "model FLOP/s (6N + 12LDT per token)", j["model_flops"], b["model_flops"],
           j["model_flops"] / b["model_flops"], "", None, "FLOP/s"),
      _row("gpt", f"MFU vs matmul peak {r['peak_flops']:.3g} FLOP/s", j["mfu"], b["mfu"],
           j["mfu"] / b["mfu"], ">= 0.45 MFU" if on_gpu else "",
           (j["mfu"] >= 0.45) if on_gpu else None)]


@register_bench("compile")
def _compile(ctx):
  from jaxdl.bench import gpt
  r = gpt.bench_compile()
  scan, unrolled = r["scan"], r["unrolled"]
  return r, [
      _row("compile", "scan: seconds at 24 vs 2 layers", scan[24], scan[2],
           scan[24] / scan[2], "<= 1.5", scan[24] / scan[2] <= 1.5, "s"),
      _row("compile", "unrolled: seconds at 24 vs 2 layers", unrolled[24], unrolled[2],
           unrolled[24] / unrolled[2], "(grows)", None, "s"),
      _row("compile", "24 layers: scan vs unrolled", scan[24], unrolled[24],
           scan[24] / unrolled[24], "", None, "s"),
      _row("compile", "8 layers: scan vs unrolled", scan[8], unrolled[8],
           scan[8] / unrolled[8], "", None, "s")]


@register_bench("loop", experiments=("char_gpt",))
def _loop(ctx):
  from jaxdl.bench import engine
  r = engine.bench_loop(ctx["configs"]["char_gpt"])
  rows = [_row("loop", "jaxdl.train.run vs bare jitted loop, steps/s",
               r["loop_steps_per_s"], r["bare_steps_per_s"],
               r["loop_steps_per_s"] / r["bare_steps_per_s"], "overhead <= 5%",
               r["overhead"] <= 0.05, "steps/s"),
          _row("loop", "CPU seconds per step: loop vs bare (host work)",
               r["loop_cpu_s"], r["bare_cpu_s"], r["loop_cpu_s"] / r["bare_cpu_s"],
               "overhead <= 5%", r["overhead_cpu"] <= 0.05, "s")]
  for lag in (1, 2):
    rows.append(_row("loop", f"bare loop reading step s-{lag}'s loss each step vs bare",
                     r[f"lag{lag}_bare_steps_per_s"], r["bare_steps_per_s"],
                     r[f"lag{lag}_bare_steps_per_s"] / r["bare_steps_per_s"], "", None,
                     "steps/s"))
  return r, rows


@register_bench("watch", experiments=("char_gpt",))
def _watch(ctx):
  from jaxdl.bench import engine
  r = engine.bench_watch(ctx["configs"]["char_gpt"])
  k = r["every"]
  return r, [
      _row("watch", f"step with train.watch='cheap' every {k} vs plain step (per step)",
           r["step_s"]["plain"] * (1 + r["cheap_overhead"]), r["step_s"]["plain"],
           1 + r["cheap_overhead"], "overhead <= 5%", r["cheap_overhead"] <= 0.05, "s"),
      _row("watch", f"step with train.watch='detailed' every {k} vs plain step (per step)",
           r["step_s"]["plain"] * (1 + r["detailed_overhead"]), r["step_s"]["plain"],
           1 + r["detailed_overhead"], "overhead <= 10%", r["detailed_overhead"] <= 0.10,
           "s"),
      _row("watch", "  cheap, CPU seconds (load-insensitive)", None, None,
           1 + r["cheap_overhead_cpu"], "overhead <= 5%", r["cheap_overhead_cpu"] <= 0.05),
      _row("watch", "  detailed, CPU seconds (load-insensitive)", None, None,
           1 + r["detailed_overhead_cpu"], "overhead <= 10%",
           r["detailed_overhead_cpu"] <= 0.10)]


@register_bench("checkpoint")
def _checkpoint(ctx):
  from jaxdl.bench import engine, gpt
  abstract, _ = gpt.jaxdl_step(ctx["setup"], abstract=True)
  r = engine.bench_checkpoint(engine.synthetic_state(abstract))
  mb = r["bytes"] / 1e6
  return r, [_row("checkpoint", f"loop blocked: async vs sync save ({mb:.0f} MB)",
                  r["async_blocked_s"], r["sync_s"], r["ratio"], "<= 0.2", r["ratio"] <= 0.2,
                  "s")]


@register_bench("sampler", experiments=("fm_toy2d", "fm_digits_cfg"))
def _sampler(ctx):
  from jaxdl.bench import engine
  results, rows = {}, []
  for experiment, batch in (("fm_toy2d", 256), ("fm_digits_cfg", 64)):
    r = results[experiment] = engine.bench_sampler(ctx["configs"][experiment], batch)
    what = f"{experiment}: lax loop vs {r['steps']} x its {r['sampler']} step alone, x{batch}"
    rows += [_row("sampler", what, r["lax_s"], r["steps_s"], r["ratio"], "<= 1.05",
                  r["ratio"] <= 1.05, "s"),
             _row("sampler", "  same, CPU seconds (load-insensitive)", None, None,
                  r["ratio_cpu"], "<= 1.05", r["ratio_cpu"] <= 1.05),
             _row("sampler", "  same samples as the Python loop: max |diff|", r["max_abs_diff"],
                  0.0, None, "<= 1e-4", r["max_abs_diff"] <= 1e-4)]
  # Equal network calls (20 a sample): each new rule's time per sample over Euler's.
  r = results["equal_calls"] = engine.bench_sampler_nfe(ctx["configs"]["fm_digits_cfg"], 64)
  for name, ratio in r["ratio"].items():
    what = (f"fm_digits_cfg: {name} ({r['steps'][name]} steps) vs euler "
            f"({r['steps']['euler']}), s/sample at {r['calls']} calls, x{r['batch']}")
    rows += [_row("sampler", what, r["sample_s"][name], r["sample_s"]["euler"], ratio, "<= 1.05",
                  ratio <= 1.05, "s"),
             _row("sampler", "  same, CPU seconds (load-insensitive)", None, None,
                  r["ratio_cpu"][name], "<= 1.05", r["ratio_cpu"][name] <= 1.05)]
  return results, rows


@register_bench("data")
def _data(ctx):
  from jaxdl.bench import engine, gpt
  setup = ctx["setup"]
  step_s = ctx.get("step_s")
  if step_s is None:  # the step's rate, measured here when the gpt bench did not run
    state, step = gpt.jaxdl_step(setup)
    runner = gpt.runner(state, step, gpt.random_batch(setup))
    runner(1)
    step_s = gpt.interleaved({"j": runner}, steps=1, rounds=2)["j"]["wall"]
  r = engine.bench_data(setup.batch, setup.context)
  r["train_steps_per_s"] = 1.0 / step_s
  rows = [_row("data", "pipeline batches/s vs train steps/s", r["batches_per_s"],
               r["train_steps_per_s"], r["batches_per_s"] * step_s, ">= 1",
               r["batches_per_s"] * step_s >= 1.0, "1/s")]
  r["dataloader"] = ctx["dataloader"] = _dataloader(("bpe", "images"))
  return r, rows + _dataloader_rows("data", r["dataloader"])


def _dataloader(pipelines):
  from jaxdl.bench import loaders
  return loaders.bench_dataloader(pipelines)


_PIPELINES = {"bpe": "packed BPE text (bpe_gpt)", "images": "augmented 32x32 RGB images"}


def _dataloader_rows(bench, r):
  """grain vs a PyTorch DataLoader doing the same work (`jaxdl.bench.loaders`), per pipeline and
  worker count; one row saying how to enable it when torch is not installed."""
  if "skipped" in r:
    return [_row(bench, f"grain vs a PyTorch DataLoader doing the same work: {r['skipped']}",
                 None, None, None, ">= 1", None)]
  rows = []
  for name, by_workers in r.items():
    for w, x in by_workers.items():
      rows.append(_row(bench, f"{_PIPELINES[name]}: grain vs DataLoader batches/s, {w} workers",
                       x["grain"], x["dataloader"], x["ratio"], ">= 1", x["ratio"] >= 1.0, "1/s"))
      if "ratio_cpu" in x:
        rows.append(_row(bench, "  same, CPU seconds (load-insensitive)", None, None,
                         x["ratio_cpu"], ">= 1", x["ratio_cpu"] >= 1.0))
  return rows


@register_bench("accum", experiments=("char_gpt", "digits_cnn", "digits_mlp", "fm_digits_cfg"))
def _accum(ctx):
  from jaxdl.bench import cnn
  r = cnn.bench_accum_families(ctx["configs"])
  rows = []
  for name, x in r.items():
    n, m = x["n"], x["micro_rows"]
    rows += [_row("accum", f"{name} step ({x['loop']}): grad_accum={n} on {n}x{m} rows vs {n} "
                  f"steps of {m}", x["accum_step_s"], n * x["micro_step_s"], x["ratio"],
                  "<= 1.1", x["ratio"] <= 1.1, "s"),
             _row("accum", "  same, CPU seconds", None, None, x["ratio_cpu"], "<= 1.1",
                  x["ratio_cpu"] <= 1.1),
             _row("accum", f"  temporary memory, grad_accum={n} vs one {m}-row step",
                  x["temp_bytes"], x["micro_temp_bytes"], x["memory_ratio"], "<= 1.3",
                  x["memory_ratio"] <= 1.3, "B")]
  return r, rows


@register_bench("xla_cpu", experiments=("digits_cnn",))
def _xla_cpu(ctx):
  from jaxdl.bench import cnn
  x = cnn.bench_xla_cpu(ctx["configs"]["digits_cnn"])
  n = x["grad_accum"]
  return x, [_row("xla_cpu", f"{x['experiment']} step at grad_accum={n}, XLA:CPU workarounds "
                  "on vs off", x["step_s_with"], x["step_s_without"], x["ratio"], "< 0.9",
                  x["ratio"] < 0.9, "s")]


@register_bench("augment", experiments=("digits_cnn",))
def _augment(ctx):
  from jaxdl.bench import cnn
  r = {"digits": cnn.bench_augment(ctx["configs"]["digits_cnn"]), "rgb32": cnn.bench_augment_rgb()}
  rows = []
  for name, x in r.items():
    what = "digits" if name == "digits" else "32x32 RGB"
    rows.append(_row("augment", f"{what} pipeline with augment ({','.join(x['ops'])}) "
                     "batches/s vs CNN steps/s", x["batches_per_s"], x["steps_per_s"],
                     x["ratio"], ">= 1", x["ratio"] >= 1.0, "1/s"))
  return r, rows


@register_bench("data_bpe")
def _data_bpe(ctx):
  from jaxdl.bench import text_data
  r = text_data.bench_packed_bpe()
  rows = [_row("data_bpe", "bpe_gpt packed BPE pipeline batches/s vs its train steps/s",
               r["batches_per_s"], r["steps_per_s"], r["ratio"], ">= 1", r["ratio"] >= 1.0,
               "1/s")]
  if ctx.get("dataloader") is None:  # the data bench, when it ran, reported this pipeline
    r["dataloader"] = _dataloader(("bpe",))
    rows += _dataloader_rows("data_bpe", r["dataloader"])
  return r, rows


@register_bench("moe")
def _moe(ctx):
  from jaxdl.bench import blocks
  r = blocks.bench_moe()
  s, c = r["step_s"], r["cpu_step_s"]
  flops = {k: v["flops_per_token"] for k, v in r["costs"].items()}
  return r, [_row("moe", f"step, E=8 k=2 vs dense 8D MLP (FLOPs/token {flops['moe']} vs "
                  f"{flops['dense']})", s["moe"], s["dense"], s["moe"] / s["dense"], "<= 1.5",
                  s["moe"] / s["dense"] <= 1.5, "s"),
             _row("moe", "  same, CPU seconds", None, None, c["moe"] / c["dense"], "<= 1.5",
                  c["moe"] / c["dense"] <= 1.5)]


@register_bench("moe_dispatch")
def _moe_dispatch(ctx):
  from jaxdl.bench import blocks
  r = blocks.bench_moe_dispatch()
  return r, [_row("moe_dispatch", f"MoE layer fwd+bwd CPU s, one-hot einsum vs index dispatch, "
                  f"N={n}", r["onehot"][n], r["index"][n], r["ratio"][n], "> 1",
                  r["ratio"][n] > 1.0, "s") for n in r["tokens"]]


@register_bench("ssm")
def _ssm(ctx):
  from jaxdl.bench import blocks
  r = blocks.bench_ssm()
  lo, hi = r["lengths"][0], r["lengths"][-1]
  return r, [_row("ssm", f"CPU s/step at T={hi} vs T={lo} (same tokens), {m}", r[m][hi],
                  r[m][lo], r["growth"][m], "", None, "s") for m in ("ssm", "attention")] + [
      _row("ssm", f"growth T={lo}->{hi}: attention / ssm", None, None,
           r["growth"]["attention"] / r["growth"]["ssm"], "> 1",
           r["growth"]["attention"] > r["growth"]["ssm"])]


@register_bench("lora")
def _lora(ctx):
  from jaxdl.bench import lora
  r = lora.bench_lora_state()
  return r, [_row("lora", f"optimizer-state bytes, LoRA r={r['rank']} on {name} vs full "
                  f"fine-tuning ({r['preset']}, AdamW)", r[name]["state_bytes"],
                  r["full_state_bytes"], r[name]["ratio"], "<= 0.02", r[name]["ratio"] <= 0.02,
                  "B") for name in lora.TARGETS]


@register_bench("tensor")
def _tensor(ctx):
  from jaxdl.bench import tensor
  r = tensor.bench_tensor_memory()
  by = r["by_tensor"]
  one, rows = by[1], []
  for t in (2, 4):
    m = by[t]
    plan = (m["plan"] + m["batch"]) / (one["plan"] + one["batch"])
    ratio = m["args"] / one["args"]
    rows.append(_row("tensor", f"per-device argument bytes, tensor {t} vs 1 (4 CPU devices, "
                     f"AdamW GPT d {r['model']['d_model']})", m["args"], one["args"], ratio,
                     f"= plan {plan:.3f}", abs(ratio / plan - 1) <= 0.01, "B"))
    ratio = m["temp"] / one["temp"]
    rows.append(_row("tensor", f"per-device temporary bytes, tensor {t} vs 1", m["temp"],
                     one["temp"], ratio, "< 1", ratio < 1, "B"))
  return r, rows


@register_bench("memory")
def _memory(ctx):
  from jaxdl.bench import memory
  del ctx
  r = memory.bench_memory()
  by, logits = r["by_variant"], r["logits_bytes"]
  plain = by["plain"]["temp"]
  where = f"GPT T {r['seq']}, V {r['model']['vocab_size']}, {r['backend']}"
  rows = []
  for label, x in by.items():
    if label == "plain":
      continue
    ratio = x["temp"] / plain
    rows.append(_row("memory", f"temporary bytes, {label} vs plain step ({where})", x["temp"],
                     plain, ratio, "< 1", ratio < 1, "B"))
  saved = plain - by["chunked loss"]["temp"]
  rows.append(_row("memory", f"bytes the chunked loss saves vs the B x T x V fp32 logits "
                   f"(chunk {r['chunk']})", saved, logits, saved / logits, ">= 1",
                   saved >= logits, "B"))
  return r, rows


@register_bench("sequence")
def _sequence(ctx):
  from jaxdl.bench import sequence
  del ctx
  r = sequence.bench_sequence()
  by, rows = r["by_sequence"], []
  one = by[1]
  where = f"GPT T {r['seq']}, V {r['model']['vocab_size']}, {r['devices']} CPU devices"
  for s, m in by.items():
    if s != 1:
      ratio = m["temp"] / one["temp"]
      rows.append(_row("sequence", f"per-device temporary bytes, sequence {s} vs 1 ({where})",
                       m["temp"], one["temp"], ratio, "< 1", ratio < 1, "B"))
      ratio = m["step_s"] / one["step_s"]
      rows.append(_row("sequence", f"step seconds, sequence {s} vs 1 (emulated devices on one "
                       f"CPU: not a speedup)", m["step_s"], one["step_s"], ratio, "-", True,
                       "s"))
    ratio = m["temp_chunk"] / m["temp"]
    rows.append(_row("sequence", f"per-device temporary bytes, train.loss_chunk={r['chunk']} vs "
                     f"full logits ({r['logits_bytes'] / s / 2**20:.0f} MiB a device), sequence "
                     f"{s}", m["temp_chunk"], m["temp"], ratio, "< 1", ratio < 1, "B"))
  ring = r["ring"]
  if "causal" in ring:
    c, n = ring["causal"], ring["non_causal"]
    rows.append(_row("sequence", f"ring attention blocks per device, causal vs non-causal "
                     f"(sequence {ring['seq']})", c["blocks_per_device"],
                     n["blocks_per_device"], c["blocks_per_device"] / n["blocks_per_device"],
                     "(2S+1)/4S", c["blocks_per_device"] * 4 * ring["seq"]
                     == n["blocks_per_device"] * (2 * ring["seq"] + 1)))
    rows.append(_row("sequence", "ring attention forward seconds, causal vs non-causal",
                     c["s"], n["s"], c["s"] / n["s"], "< 1", c["s"] < n["s"], "s"))
  return r, rows


@register_bench("startup")
def _startup(ctx):
  from jaxdl.bench import startup
  del ctx
  r = startup.bench_startup()
  return r, [_row("startup", f"`jaxdl train {exp}` process CPU s, library heap frozen vs not",
                  x["frozen"], x["unfrozen"], x["ratio"], "< 1", x["ratio"] < 1, "s")
             for exp, x in r.items()]


@register_bench("hf_load")
def _hf_load(ctx):
  import os  # pylint: disable=g-import-not-at-top
  from jaxdl.bench import hf_load
  name = os.environ.get("JAXDL_BENCH_HF_LOAD", "1b")
  if name not in hf_load.SIZES:
    raise ValueError(f"JAXDL_BENCH_HF_LOAD: expected one of {', '.join(hf_load.SIZES)}, "
                     f"got {name!r}")
  r = hf_load.bench_hf_load(hf_load.SIZES[name])
  gb = r["disk_bytes"] / 1e9
  return r, [_row("hf_load", f"load_hf peak host bytes vs bf16 checkpoint on disk ({name}: "
                  f"{r['params'] / 1e9:.2f}B params, {gb:.2f} GB, {r['load_s']:.0f} s)",
                  r["peak_bytes"], r["disk_bytes"], r["ratio"], "<= 1.3", r["ratio"] <= 1.3, "B"),
                  _row("hf_load", f"parameters' bytes ({', '.join(r['dtypes'])}) vs on disk",
                       r["param_bytes"], r["disk_bytes"], r["param_bytes"] / r["disk_bytes"], "",
                       None, "B")]


BENCHES = tuple(REGISTRY)
