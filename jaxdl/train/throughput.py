"""Throughput of a running job: steps/s, examples/s, tokens/s, model FLOP/s and MFU.

Rates are measured on the host between two logged steps, when the loop reads their metrics back
(it already reads step s-1's metrics while step s runs, so this adds no device sync). Time spent
evaluating and checkpointing between them is left out, so the rate is the training step's:

  steps/s    = (s_b - s_a) / (t_b - t_a - t_paused)
  examples/s = steps/s x global batch B;      tokens/s = examples/s x T  (sequence tasks)
  FLOP/s     = steps/s x F_step;              MFU = FLOP/s / (peak per device x devices)

F_step, the FLOPs of one train step, comes from the model's own formula where there is one, else
from counting the matmuls of the step's jaxpr:

  GPT (PaLM appendix B, as nanoGPT and llm.c count it): F_token = 6 N + 12 L D T, N the
  parameters touched by matmuls (all but the position table wpe), L layers, D width, T context;
  F_step = F_token x B x T.
  Any other step (`matmul_flops`): the sum over the jaxpr of the traced step (forward, backward
  and update, global shapes) of
    dot_general   2 x |out| x K                 K the contracted size
    convolution   2 x B x C_out x C_in/G x (output positions x kernel taps on real input,
                  padding and dilation holes left out), as XLA counts it
    attention     4 B H T S D forward, 8 B H T S D backward (a fused kernel, e.g. cuDNN)
  with a scan's body counted `length` times, a cond's costlier branch once, a pmap's body once
  per device. Only matmuls count (elementwise work, normalization and the optimizer are left
  out, as in the GPT formula), so the count is a property of the model and batch, not of how
  XLA compiles them: dropout and noise add none. Random numbers are primitives in the jaxpr
  (XLA:CPU lowers threefry to a while loop; it is not a loop here), scanned layers and the
  microbatch loop are counted per iteration, and only a `lax.while_loop` around matmuls (a
  trip count known only at run time) makes a step uncountable; the log names it and its line.

The peak is per device and per compute dtype: a known table of dense bf16 matmul peaks for
accelerators (datasheet numbers, used for bf16/fp16 runs on those), else a large matmul timed
once per device kind, dtype and XLA_FLAGS and cached in `<cache root>/peak_flops.json`
(`jaxdl.cache`: $JAXDL_CACHE, default `~/.cache/jaxdl`), or `train.peak_flops` when given. The
log names the source.

Measured against `jaxdl bench gpt` (its CPU GPT: d 256, 4 layers, T 256, batch 16, fp32) on this
2-core CPU under a load average of about 20: `jaxdl train char_gpt --set model.d_model=256
--set model.n_layer=4 --set model.n_head=4 --set model.block_size=256 --set
data.context_length=256 --set data.batch_size=16 --set train.steps=40 --set train.log_every=5`
logged MFU 0.615, 0.568, 0.559, 0.540, 0.598, 0.546, 0.531, 0.514 (mean 0.559; peak 1.53e10
FLOP/s, the cached 1024^3 matmul), the bench 0.557 (peak 1.50e10, a 2048^3 matmul timed in its
run): 0.4% apart, and every window within 10%. Both count 9.214e10 FLOPs per step (tested); the
spread between windows is the machine's load, not the count.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import time

import jax
import jax.numpy as jnp

from jaxdl import cache
from jaxdl.models.costs import gpt_costs

log = logging.getLogger("jaxdl")

# Dense bf16 matmul peak per chip (FLOP/s), from the vendors' datasheets.
PEAK_BF16 = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
}

# Side of the square matmul timed as the peak where no table entry applies.
PEAK_MATMUL_N = {"cpu": 1024, "gpu": 8192, "tpu": 8192}

_PEAKS: dict[str, float] = {}   # this process's measurements, by cache key


def measure_peak(n: int, dtype, rounds: int = 3) -> float:
  """FLOP/s of an n x n x n matmul (2 n^3 FLOPs), the best of `rounds` after one warm-up."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
  mm = jax.jit(lambda a, b: a @ b)
  mm(a, b).block_until_ready()
  best = float("inf")
  for _ in range(rounds):
    t = time.perf_counter()
    mm(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best


def _cache_path() -> pathlib.Path:
  return pathlib.Path(cache.cache_dir()) / "peak_flops.json"


def device_peak(dtype, device=None) -> tuple[float, str]:
  """(peak FLOP/s of one device in `dtype`, where the number comes from)."""
  device = device or jax.devices()[0]
  name = jnp.dtype(dtype).name
  kind = device.device_kind
  if name in ("bfloat16", "float16") and kind in PEAK_BF16:
    return PEAK_BF16[kind], f"datasheet bf16 peak of {kind}"
  n = PEAK_MATMUL_N.get(device.platform, 4096)
  # XLA_FLAGS are part of the key: a matmul timed under other backend options (the test suite
  # lowers the optimization level) is not this process's peak.
  key = f"{device.platform}|{kind}|{name}|{n}|{os.environ.get('XLA_FLAGS', '').strip()}"
  path = _cache_path()
  if key not in _PEAKS:
    try:
      _PEAKS.update(json.loads(path.read_text()))
    except (OSError, ValueError):
      pass  # no cache yet (or a broken one): measure
  if key in _PEAKS:
    return _PEAKS[key], f"{n}^3 {name} matmul on {kind}, measured earlier ({path})"
  _PEAKS[key] = measure_peak(n, dtype)
  try:  # a cache that cannot be written costs a re-measurement next run, nothing else
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_PEAKS, indent=1))
  except OSError as e:
    log.debug("peak FLOP/s cache %s not written: %s", path, e)
  return _PEAKS[key], f"{n}^3 {name} matmul on {kind}, measured now"


def transformer_flops_per_token(n_matmul_params: int, n_layer: int, d_model: int,
                                context: int) -> float:
  """6 N + 12 L D T: forward and backward matmuls over the weights, plus attention's scores and
  weighted sum (the full T x T, as PaLM counts it, even when causal)."""
  return 6.0 * n_matmul_params + 12.0 * n_layer * d_model * context


def _gpt_flops(model, x_shape) -> float:
  # N counts the weights one token uses: an MoE expert's K / E of its size (all of a dense
  # model's parameters).
  n = gpt_costs(model)["active_params"]
  if getattr(model, "pos", None) == "learned":
    n -= model.block_size * model.d_model  # wpe is a lookup, not a matmul
  batch, context = x_shape[-2], x_shape[-1]
  tokens = context * batch
  return tokens * transformer_flops_per_token(n, model.n_layer, model.d_model, context)


class NotCountable(Exception):
  """A step whose matmul FLOPs are not known before it runs; the message says why."""


def _sub_jaxprs(params: dict):
  """The jaxprs among an equation's parameters (a closed one's own), read by duck typing: this
  module reads traced programs and imports no JAX internals (`jaxdl.train.xla_cpu`)."""
  for value in params.values():
    for x in value if isinstance(value, (tuple, list)) else (value,):
      if hasattr(x, "eqns"):
        yield x
      elif hasattr(getattr(x, "jaxpr", None), "eqns") and hasattr(x, "consts"):
        yield x.jaxpr


def _where(eqn) -> str:
  """'file:line' of the innermost frame outside jax that made `eqn`."""
  jax_dir = os.path.dirname(jax.__file__) + os.sep
  traceback = getattr(eqn.source_info, "traceback", None)
  for frame in getattr(traceback, "frames", ()):
    if not frame.file_name.startswith(jax_dir):
      return f"{frame.file_name}:{frame.line_num}"
  return "an unknown line"


def _size(shape) -> int:
  return math.prod(int(d) for d in shape)


def _conv_taps(n: int, k: int, out: int, stride: int, pad_lo: int, lhs_dil: int,
               rhs_dil: int) -> int:
  """Pairs (o, j) of an output position and a kernel tap whose input, at o stride + j rhs_dil -
  pad_lo in the dilated input, is a real element (not padding, not a dilation hole)."""
  count = 0
  for o in range(out):
    for j in range(k):
      at = o * stride + j * rhs_dil - pad_lo
      count += 0 <= at <= (n - 1) * lhs_dil and at % lhs_dil == 0
  return count


def _eqn_flops(eqn) -> float:
  """The matmul FLOPs of one primitive that is not a loop or call (0 for everything else)."""
  name = eqn.primitive.name
  out = eqn.outvars[0].aval.shape if eqn.outvars else ()
  if name == "dot_general":
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2.0 * _size(out) * _size(lhs[d] for d in contract)
  if name == "conv_general_dilated":
    p = eqn.params
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    taps = 1  # (output position, kernel tap) pairs that meet a real input element, per dim
    for i, (lo, _) in enumerate(p["padding"]):
      taps *= _conv_taps(lhs[lhs_spec[2 + i]], rhs[rhs_spec[2 + i]], out[out_spec[2 + i]],
                         p["window_strides"][i], lo, p["lhs_dilation"][i], p["rhs_dilation"][i])
    return 2.0 * out[out_spec[0]] * out[out_spec[1]] * rhs[rhs_spec[1]] * taps
  if "dot_product_attention" in name and ("fwd" in name or "bwd" in name):
    (b, t, h, d), s = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape[1]  # q BTHD, k BSKD
    return (8.0 if "bwd" in name else 4.0) * b * h * t * s * d
  return 0.0


def matmul_flops(jaxpr) -> float:
  """Matmul FLOPs of one run of `jaxpr` (module docstring); raises NotCountable at a
  `lax.while_loop` whose body holds matmuls."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr's own
  total = 0.0
  for eqn in jaxpr.eqns:
    name, params = eqn.primitive.name, eqn.params
    inner = [matmul_flops(j) for j in _sub_jaxprs(params)]
    if name == "while":
      if sum(inner):
        raise NotCountable(
            "the step holds a lax.while_loop around matmuls, whose trip count is known only "
            f"when it runs (at {_where(eqn)})")
    elif name == "cond":
      total += max(inner)
    elif name == "scan":
      total += params["length"] * sum(inner)
    elif name == "xla_pmap":
      total += params["axis_size"] * sum(inner)
    elif name == "shard_map":  # one body per device of the mesh's manual axes
      mesh, axes = params["mesh"], params.get("manual_axes", ())
      total += _size(mesh.shape[a] for a in axes) * sum(inner)
    else:  # calls (jit, remat, custom_jvp/vjp) run their body once
      total += _eqn_flops(eqn) + sum(inner)
  return total


def count_step_flops(r, train_fn, state, batch) -> tuple[float | None, str]:
  """(FLOPs of one global train step, or None, and how they were counted, or why not).

  Traces `train_fn` for (state, batch) before its first call: jit keeps the trace, so the first
  step does not trace again. Nothing is compiled here.
  """
  if r.config.model.get("name") == "gpt" and r.task.kind.sequence_model:
    global_x = (r.data.batch_size, batch["x"].shape[-1])
    return _gpt_flops(r.model, global_x), "GPT formula 6N + 12LDT per token"
  jaxpr = (train_fn.trace(state, batch).jaxpr if hasattr(train_fn, "trace")
           else jax.make_jaxpr(train_fn)(state, batch))
  try:
    flops = matmul_flops(jaxpr)
  except NotCountable as e:
    return None, str(e)
  if flops <= 0:
    return None, "the step holds no matmul or convolution to count"
  return flops, "matmuls and convolutions of the step's jaxpr"


class Meter:
  """Turns the host times of logged steps into throughput metrics.

  `prepare(train_fn, state, batch)` once before the first step (FLOPs and peak), then
  `tick(step)` at each logged step's read-back returns the rates since the previous one;
  `with meter.paused():` leaves evaluation and checkpoint time out.
  """

  def __init__(self, r, enabled: bool = True, log_info: bool = True):
    self.r, self.count, self.log_info = r, enabled and r.train.count_flops, log_info
    self.batch = r.data.batch_size
    self.ready = False
    self.flops_step = self.peak = None
    self.tokens = 0
    self.last: tuple[int, float] | None = None
    self.excluded = 0.0

  def prepare(self, train_fn, state, batch) -> None:
    self.ready = True
    if self.r.task.kind.sequence_model:
      self.tokens = int(batch["x"].shape[-1])
    if not self.count:
      return
    try:
      self.flops_step, how = count_step_flops(self.r, train_fn, state, batch)
    except Exception as e:  # noqa: BLE001 -- a failed count costs the MFU column, not the run
      self.flops_step, how = None, f"counting failed ({type(e).__name__}: {e})"
    if self.flops_step is None:
      if self.log_info:
        log.info("throughput: no MFU: %s", how)
      return
    devices = self.r.strategy.num_global_devices
    given = self.r.train.peak_flops
    peak, source = ((given, "train.peak_flops") if given > 0
                    else device_peak(self.r.policy.compute_dtype))
    self.peak = peak * devices
    if self.log_info:
      log.info("throughput: %.4g FLOPs per step (%s); peak %.4g FLOP/s per device x %d (%s)",
               self.flops_step, how, peak, devices, source)

  @contextlib.contextmanager
  def paused(self):
    t = time.perf_counter()
    try:
      yield
    finally:
      self.excluded += time.perf_counter() - t

  def tick(self, step: int) -> dict:
    """Rates since the previous tick ({} at the first one, or after a rewind)."""
    now = time.perf_counter()
    last, self.last = self.last, (step, now)
    excluded, self.excluded = self.excluded, 0.0
    if last is None or step <= last[0]:
      return {}
    seconds = now - last[1] - excluded
    if seconds <= 0:
      return {}
    steps_per_s = (step - last[0]) / seconds
    out = {"steps_per_s": steps_per_s, "examples_per_s": steps_per_s * self.batch}
    if self.tokens:
      out["tokens_per_s"] = out["examples_per_s"] * self.tokens
    if self.flops_step is not None:
      out["flops_per_s"] = steps_per_s * self.flops_step
      out["mfu"] = out["flops_per_s"] / self.peak
    return out
