"""Decoder-only transformer (GPT), its size presets and its `model` config section.

Shapes: B batch, T sequence, D model width, V vocab.

  x_0 = wte[tokens] + wpe[positions]  (or RoPE inside attention with pos='rope')
  x_L = L transformer blocks (`jaxdl.models.transformer`, causal)
  Packed documents (`segment_ids`, `positions` from `jaxdl.data.packing`; each document one run
  of equal ids): positions restart at 0 in each document, and each mixer reads only its own
  document's past:
    attention  token i attends to token j iff j <= i and segment_ids[j] = segment_ids[i]
    ssm        at a start s (segment_ids[s] != segment_ids[s-1]) the decay is 0, h_s = delta_s
               B_s u_s, and the causal convolution's taps before s read 0 (`jaxdl.models.ssm`)
    MLP / MoE  token by token
  so each document's logits are those it gets run alone. An MoE's expert capacity is shared by
  every token of the batch: with a capacity factor below moe_experts / moe_top_k, one document's
  choices can be dropped because of another's (`jaxdl.models.moe`).
  logits = LN_f(x_L) wte^T  (tied head; `lm_head` when tie_embeddings is off)
Attention has n_head query heads and n_kv_head key/value heads (grouped-query attention; 0 means
n_head). With lora_rank > 0 low-rank adapters sit beside the dense layers lora_targets names and
only they train (`jaxdl.models.lora`; `lora.merge` folds them into the base weights).
Parameter names follow GPT-2 (wte, wpe, h.ln_1, h.attn.c_attn, ...), so GPT-2's checkpoint is a
renaming; `hf.py` reads and writes Hugging Face directories of GPT-2 and of Llama / Mistral /
Qwen2 / Qwen3 / Phi-3 (pos='rope', norm='rms', mlp='swiglu' with rope_theta, the rope_scaling
settings, rope_partial, head_dim, qkv_bias, attn_bias, mlp_bias and qk_norm), their tables in
`hf_families.py` (Phi-3's in `hf_phi.py`), and of Gemma 1-3 (norm='rms1p', mlp='geglu',
embed_scale, ln='sandwich', the soft-caps, attn_pattern: `hf_gemma.py`). Decoding (KV cache,
sampling, generate) is in `jaxdl.models.decoding`.
"""

from __future__ import annotations

import dataclasses
import functools
import chex
import flax.linen as nn
import jax.numpy as jnp
import ml_collections
from jax.sharding import PartitionSpec as P

from jaxdl.models import (layers, lora, moe, register_model, ring_attention, ssm, stack,
                          transformer)
from jaxdl.models import rope as rope_lib
from jaxdl.schema import (NONNEG, OPEN_FRACTION, POSITIVE, Check, ConfigError, each, fail,
                          one_of, setting)


class GPT(transformer.TransformerModel):
  """GPT: tokens int (B, T) -> logits fp32 (B, T, V). The fields are the `model` config keys
  (the stack's and the blocks' are `transformer.TransformerModel`'s).

  `model.apply(v, tokens, train=False)` is the full forward. With `cache` (from
  `decoding.init_cache`) and `pos` (position of tokens[:, 0]) it returns `(logits, new_cache)`
  for incremental decoding. `segment_ids` and `positions` (int (B, T)) describe packed
  documents (module docstring). `start` (int (B,)) is left padding, for batches of prompts of
  different lengths: row b's text begins at index start[b], so token i of it sits at position
  pos + i - start[b] and no token attends to an index before start[b] (cached or not; the
  padding's own outputs are meaningless). With `hidden=True` it returns `(h, w)` instead of
  the logits: the final hidden states h (B, T, D) and the unembedding w (D, V), both in the
  compute dtype, logits = h w (cast to fp32; then soft-capped by `logit_softcap` if set: the
  caller applies it), for a loss that never holds all B x T x V of them
  (`jaxdl.train.chunked_loss`). The defaults are GPT-2's architecture choices.
  """

  vocab_size: int = setting(256, POSITIVE)
  block_size: int = setting(256, POSITIVE)
  pos: str = setting("learned", one_of("learned", "rope"))
  # RoPE base theta (pos='rope'): feature pair i of a K-wide head turns by pos * theta^(-2i/K).
  rope_theta: float = setting(10000.0, POSITIVE)
  # RoPE context extension, as transformers computes it (`rope.rope_frequencies`): 'linear'
  # divides every frequency by rope_factor; 'llama3' (Llama 3.1+) divides those whose wavelength
  # exceeds rope_original_max / rope_low_freq_factor, keeps those below rope_original_max /
  # rope_high_freq_factor and blends between; 'yarn' ramps between beta_fast and beta_slow
  # rotations and multiplies cos, sin by rope_attn_factor (0: 0.1 ln(rope_factor) + 1).
  # 'dynamic' (NTK) raises theta with the length a call reaches past rope_original_max;
  # 'longrope' (Phi-3) divides frequency i by rope_short_factor[i] up to rope_original_max
  # positions and by rope_long_factor[i] past it, cos and sin times rope_attn_factor (0:
  # sqrt(1 + ln(rope_factor) / ln(rope_original_max))); with a KV cache both as transformers'
  # generate computes them (`jaxdl.models.rope`'s docstring).
  # rope_original_max, the pretraining context, 0: block_size.
  rope_scaling: str = setting("none", one_of(*rope_lib.ROPE_SCALINGS))
  rope_factor: float = setting(1.0, POSITIVE)
  rope_original_max: int = setting(0, NONNEG)
  rope_low_freq_factor: float = setting(1.0, POSITIVE)
  rope_high_freq_factor: float = setting(4.0, POSITIVE)
  rope_beta_fast: float = setting(32.0, POSITIVE)
  rope_beta_slow: float = setting(1.0, POSITIVE)
  rope_attn_factor: float = setting(0.0, NONNEG)
  rope_short_factor: tuple[float, ...] = setting((), each(POSITIVE))
  rope_long_factor: tuple[float, ...] = setting((), each(POSITIVE))
  # The fraction of each head's features RoPE turns, the first int(K rope_partial) (Phi-4-mini:
  # 0.75); the others pass unrotated.
  rope_partial: float = setting(1.0, OPEN_FRACTION)
  # Biases on the query/key/value projection even with use_bias off (Qwen2: biased Q, K, V and
  # unbiased output and MLP projections).
  qkv_bias: bool = False
  # Biases on the query, key, value and output projections (attn_bias), on the MLP's (mlp_bias),
  # even with use_bias off (Llama's attention_bias and mlp_bias).
  attn_bias: bool = False
  mlp_bias: bool = False
  # Sliding-window attention (Mistral, Qwen2): W > 0 lets token i see only tokens i - W < j <= i,
  # in the full forward and in cached decoding alike, so a sequence may run past W; 0: none.
  sliding_window: int = setting(0, NONNEG)
  # Per-layer attention kinds (`local_layers`): attn_pattern's letters, cycled over the layers,
  # make layer i local ('l': the sliding window, and RoPE of base rope_local_theta, unscaled,
  # when that is set) or global ('g': full causal attention, the model's RoPE); '': every layer
  # local iff sliding_window > 0. Gemma 2: 'lg'; Gemma 3: 'lllllg'; Qwen2's max_window_layers k
  # of L: k 'g' then L - k 'l' (one letter per layer: no shorter period).
  attn_pattern: str = setting("", Check(lambda v: isinstance(v, str) and set(v) <= {"l", "g"},
                                        "must be letters 'l' (local) and 'g' (global)"))
  rope_local_theta: float = setting(0.0, NONNEG)
  # Gemma: attention logits Q K^T / sqrt(attn_scale_dim) (0: the head width K) soft-capped
  # c tanh(z / c) with c = attn_softcap (0: none); the output logits likewise by logit_softcap;
  # embed_scale multiplies the token embeddings by sqrt(d_model) (rounded to the compute dtype).
  attn_scale_dim: float = setting(0.0, NONNEG)
  attn_softcap: float = setting(0.0, NONNEG)
  logit_softcap: float = setting(0.0, NONNEG)
  embed_scale: bool = False
  tie_embeddings: bool = True
  # Mixture of experts (`jaxdl.models.moe`): moe_experts = E > 0 replaces every block's MLP by E
  # GELU experts, each token routed to moe_top_k of them; capacity factor and aux-loss weights.
  moe_experts: int = setting(0, NONNEG)
  moe_top_k: int = setting(2, POSITIVE)
  moe_capacity: float = setting(1.25, POSITIVE)
  moe_balance_coef: float = setting(0.01, NONNEG, run_choice=True)
  moe_z_coef: float = setting(1e-3, NONNEG, run_choice=True)
  # The token mixer of every block: 'attention', or 'ssm' (`jaxdl.models.ssm`: a selective
  # diagonal recurrence with ssm_state N per channel over ssm_expand * d_model channels, after a
  # causal depthwise convolution of width ssm_conv).
  mixer: str = setting("attention", one_of("attention", "ssm"))
  ssm_state: int = setting(16, POSITIVE)
  ssm_expand: int = setting(2, POSITIVE)
  ssm_conv: int = setting(4, POSITIVE)
  # LoRA (`jaxdl.models.lora`): lora_rank = r > 0 adds (lora_alpha / r) x A B beside each dense
  # layer that a pattern of lora_targets names (attn/q, attn/k, attn/v, attn/o, mlp/c_fc,
  # mlp/c_proj) and freezes every other parameter (trains only A and B); 0: off.
  lora_rank: int = setting(0, NONNEG, run_choice=True)
  lora_alpha: float = setting(16.0, POSITIVE, run_choice=True)
  lora_targets: tuple[str, ...] = setting(("q", "v"), run_choice=True)

  def check(self):
    super().check()
    lora.check_rank(self)  # resolves lora_targets (a pattern matching nothing fails) and the rank
    if self.moe_experts and self.moe_top_k > self.moe_experts:
      fail("model.", "moe_top_k", f"must be in [1, {self.moe_experts}] (moe_experts), got "
           f"{self.moe_top_k}")
    if "l" in self.attn_pattern and not self.sliding_window:
      fail("model.", "attn_pattern", f"has local layers ('l'), which need sliding_window > 0, "
           f"got {self.attn_pattern!r} with sliding_window=0")
    if self.rope_local_theta and not self.rope:
      fail("model.", "rope_local_theta", f"sets the local layers' RoPE; pos={self.pos!r} has "
           f"none, got {self.rope_local_theta} (expected 0)")
    if self.rope_local_theta and self.rope and not any(self.local_layers):
      fail("model.", "rope_local_theta", f"sets the local layers' RoPE; there are none "
           f"(sliding_window={self.sliding_window}, attn_pattern={self.attn_pattern!r}), got "
           f"{self.rope_local_theta} (expected 0)")
    if self.rope_partial != 1.0 and not self.rope:
      fail("model.", "rope_partial", f"is the share of features RoPE turns; pos={self.pos!r} "
           f"has none, got {self.rope_partial} (expected 1.0)")
    for key in ("attn_bias", "attn_scale_dim", "attn_softcap"):
      if getattr(self, key) and self.mixer != "attention":
        fail("model.", key, f"acts on attention; mixer={self.mixer!r} has none, got "
             f"{getattr(self, key)!r}")
    if self.sliding_window and self.mixer != "attention":
      fail("model.", "sliding_window", f"windows attention; mixer={self.mixer!r} has none, got "
           f"{self.sliding_window} (expected 0)")
    if self.rope_scaling != "none" and not self.rope:
      fail("model.", "rope_scaling", f"scales RoPE; pos={self.pos!r} has none, got "
           f"{self.rope_scaling!r} (expected 'none')")
    if self.rope and self.mixer == "attention" and self.head_width % 2:
      fail("model.", "head_dim", f"RoPE turns feature pairs: the head width must be even, got "
           f"{self.head_width}")
    r = rope_lib.rotary_width(self.rope_spec, self.head_width)
    if self.rope and self.mixer == "attention" and (r % 2 or r <= 0):
      fail("model.", "rope_partial", f"RoPE turns feature pairs: int({self.head_width} x "
           f"rope_partial) must be even and > 0, got {r} features from {self.rope_partial}")
    for key in ("rope_short_factor", "rope_long_factor"):
      got = len(getattr(self, key))
      if (self.rope_scaling == "longrope") != bool(got) or (got and got != r // 2):
        fail("model.", key, f"one factor per rotated feature pair, {r // 2}, for rope_scaling="
             f"'longrope' and none otherwise, got {got} for {self.rope_scaling!r}")
    reads = _ROPE_READS[self.rope_scaling]
    for f in dataclasses.fields(self):  # a key the scaling never reads would be ignored
      if f.name in _ROPE_READS["longrope"] + _ROPE_READS["llama3"] + _ROPE_READS["yarn"] and (
          f.name not in reads and getattr(self, f.name) != f.default):
        fail("model.", f.name, f"rope_scaling={self.rope_scaling!r} does not use it (only "
             f"{', '.join(reads) or 'rope_theta'}), got {getattr(self, f.name)!r} (expected "
             f"{f.default!r})")
    if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
      fail("model.", "rope_high_freq_factor", f"must exceed rope_low_freq_factor="
           f"{self.rope_low_freq_factor} (llama3 blends between them), got "
           f"{self.rope_high_freq_factor}")
    if self.moe_experts and self.mlp != "gelu":
      fail("model.", "mlp", f"the experts of moe_experts > 0 are GELU MLPs; got {self.mlp!r}, "
           "expected 'gelu'")

  @property
  def local_layers(self) -> tuple[bool, ...]:
    """Per layer, whether it is local (windowed): attn_pattern's letters cycled over the L
    layers ('l'); with no pattern every layer is local iff sliding_window > 0.

    A stack that mixes both stays one `nn.scan` of one compiled block, the kind passed in as a
    scanned (L,) bool (`stack.apply_blocks`) that selects the mask band and the RoPE
    frequencies inside the block. Splitting the stack into runs of equal kinds instead would
    make Gemma 3's 5-local-1-global pattern ten scans over 26 layers (compile time growing
    with depth again) and the parameter layout depend on the pattern; the select costs a T x S
    compare and a K/2 choice per layer. A stack of one kind keeps the static path."""
    if not self.sliding_window:
      return (False,) * self.n_layer
    p = self.attn_pattern or "l"
    return tuple(p[i % len(p)] == "l" for i in range(self.n_layer))

  @property
  def rope(self) -> bool:
    return self.pos == "rope"

  @property
  def rope_spec(self) -> rope_lib.RopeSpec:
    """The RoPE settings in one value, rope_original_max resolved (0: block_size)."""
    return rope_lib.RopeSpec(
        self.rope_theta, self.rope_scaling, self.rope_factor,
        self.rope_original_max or self.block_size, self.rope_low_freq_factor,
        self.rope_high_freq_factor, self.rope_beta_fast, self.rope_beta_slow,
        self.rope_attn_factor, self.rope_partial, tuple(self.rope_short_factor),
        tuple(self.rope_long_factor))

  @property
  def local_rope(self) -> rope_lib.RopeSpec | None:
    """The local layers' own RoPE: plain RoPE of base rope_local_theta (rotating the features
    the model's RoPE rotates), or None (they use rope_spec) when it is 0 or no layer is local."""
    if not self.rope_local_theta or not any(self.local_layers):
      return None
    return rope_lib.RopeSpec(theta=self.rope_local_theta, partial=self.rope_spec.partial)

  @property
  def moe_spec(self) -> moe.MoeSpec | None:
    if not self.moe_experts:
      return None
    return moe.MoeSpec(self.moe_experts, self.moe_top_k, self.moe_capacity,
                       self.moe_balance_coef, self.moe_z_coef)

  @property
  def ssm_spec(self) -> ssm.SsmSpec | None:
    if self.mixer != "ssm":
      return None
    return ssm.SsmSpec(self.ssm_state, self.ssm_expand, self.ssm_conv)

  @property
  def lora_spec(self) -> lora.LoraSpec | None:
    """The adapters (None when lora_rank is 0): the sites lora_targets matches among this
    model's (attention ones unless mixer='ssm', MLP ones unless moe_experts > 0)."""
    if not self.lora_rank:
      return None
    sites = ((lora.ATTENTION_SITES if self.mixer == "attention" else ()) +
             (lora.MLP_SITES if not self.moe_experts else ()))
    return lora.LoraSpec(self.lora_rank, self.lora_alpha,
                         lora.resolve_sites(self.lora_targets, sites))

  def __call__(self, x, *, train: bool, cache=None, pos=0, segment_ids=None, positions=None,
               start=None, hidden: bool = False):
    forward = GPT.forward
    if self.lora_rank and not self.is_initializing():
      # The base is frozen: read through stop_gradient, its parameters' gradients are symbolic
      # zeros, so the backward pass computes no weight gradient but the adapters'.
      forward = nn.map_variables(forward, "params", trans_in_fn=lora.freeze_base, mutable=False)
    return forward(self, x, train=train, cache=cache, pos=pos, segment_ids=segment_ids,
                   positions=positions, start=start, hidden=hidden)

  @nn.compact
  def forward(self, x, *, train: bool, cache=None, pos=0, segment_ids=None, positions=None,
              start=None, hidden: bool = False):
    """The forward pass of `__call__` (which freezes the base parameters under LoRA)."""
    chex.assert_rank(x, 2, custom_message=f"{self.name or 'GPT'}: tokens must be int (B, T)")
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise TypeError(f"GPT: tokens must be integers, got {x.dtype}")
    b, t = x.shape
    limit = self.block_size if cache is None or "k" not in cache else cache["k"].shape[2]
    if t > limit or (isinstance(pos, int) and pos + t > limit):
      raise ValueError(f"GPT: sequence of {t} tokens at position {pos} exceeds the context of "
                       f"{limit} (block_size={self.block_size})")
    if cache is not None and (segment_ids is not None or positions is not None):
      raise ValueError("GPT: cached decoding continues one document; segment_ids and "
                       "positions are for packed training batches")
    if start is not None and self.mixer != "attention":
      raise ValueError(f"GPT: start (left padding) needs attention to mask the padding; "
                       f"mixer={self.mixer!r} reads it into its state")
    if start is not None and (segment_ids is not None or positions is not None):
      raise ValueError("GPT: start (left padding) and packed documents (segment_ids, positions) "
                       "are exclusive")
    mask = None
    if start is not None:
      start_Bx1 = jnp.asarray(start, jnp.int32).reshape(b, 1)
      positions = jnp.maximum(pos + jnp.arange(t)[None] - start_Bx1, 0)
      s = t if cache is None else limit
      mask = (jnp.arange(s)[None] >= start_Bx1)[:, None, None, :]  # B x 1 x 1 x S: no padding
    if segment_ids is not None and positions is None:
      raise ValueError(f"GPT: segment_ids without positions (model.pos={self.pos!r}): packed "
                       "documents need both, from jaxdl.data.packing.segment_positions")
    # Split over devices along the sequence (`ring_attention`): the layout in, and back out below.
    seq = self.sequence if cache is None and not self.is_initializing() else None
    if seq is not None:
      if mask is not None:
        raise ValueError("GPT: start (left padding) is for decoding, not a sequence split over "
                         "devices")
      x, positions, segment_ids = ring_attention.enter(seq, x, positions, segment_ids, pos)
    emb = functools.partial(nn.Embed, features=self.d_model, dtype=self.dtype,
                            param_dtype=self.param_dtype,
                            embedding_init=nn.initializers.normal(0.02))
    wte = emb(self.vocab_size, name="wte")
    x_BxTxD = wte(x)
    if self.embed_scale:  # transformers casts sqrt(D) to the embeddings' dtype first
      x_BxTxD = x_BxTxD * jnp.asarray(self.d_model ** 0.5, x_BxTxD.dtype)
    if self.pos == "learned":
      wpe = emb(self.block_size, name="wpe")
      x_BxTxD = x_BxTxD + (wpe(pos + jnp.arange(t))[None] if positions is None
                           else wpe(positions))
    x_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(x_BxTxD)
    x_BxTxD, new_cache = stack.apply_blocks(self, x_BxTxD, train=train, cache=cache,
                                                  pos=pos, mask=mask, positions=positions,
                                                  segment_ids=segment_ids)
    if seq is not None:
      x_BxTxD = ring_attention.leave(seq, x_BxTxD)
    if hidden and cache is not None:
      raise ValueError("GPT: hidden=True is for a training loss; cached decoding returns logits")
    if self.tie_embeddings:
      if hidden:  # wte.attend's matmul: both operands in the compute dtype
        return x_BxTxD.astype(self.dtype), jnp.asarray(wte.embedding, self.dtype).T
      logits_BxTxV = wte.attend(x_BxTxD)
    else:
      head = nn.Dense(self.vocab_size, use_bias=False, dtype=self.dtype,
                      param_dtype=self.param_dtype,
                      kernel_init=layers.get_initializer(self.init_name), name="lm_head")
      if hidden:  # a call on no positions binds (or creates) the kernel and computes nothing
        head(x_BxTxD[:, :0])
        return (x_BxTxD.astype(self.dtype),
                jnp.asarray(head.variables["params"]["kernel"], self.dtype))
      logits_BxTxV = head(x_BxTxD)
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    if self.logit_softcap:
      logits_BxTxV = self.logit_softcap * jnp.tanh(logits_BxTxV / self.logit_softcap)
    if seq is not None:
      logits_BxTxV = ring_attention.constrain(logits_BxTxV, seq, P.UNCONSTRAINED)
    return logits_BxTxV if cache is None else (logits_BxTxV, new_cache)


# ---------------------------------------------------------------------------------------------
# Presets and the `model` section.

# The GPT's RoPE scaling keys each rope_scaling reads (`rope.rope_frequencies`).
_ROPE_READS = {
    "none": (), "linear": ("rope_factor",),
    "llama3": ("rope_factor", "rope_original_max", "rope_low_freq_factor",
               "rope_high_freq_factor"),
    "yarn": ("rope_factor", "rope_original_max", "rope_beta_fast", "rope_beta_slow",
             "rope_attn_factor"),
    "dynamic": ("rope_factor", "rope_original_max"),
    "longrope": ("rope_factor", "rope_original_max", "rope_attn_factor", "rope_short_factor",
                 "rope_long_factor")}

PRESETS = {
    "gpt2-small": dict(n_layer=12, d_model=768, n_head=12, vocab_size=50257, block_size=1024),
    "gpt2-medium": dict(n_layer=24, d_model=1024, n_head=16, vocab_size=50257, block_size=1024),
    "gpt2-large": dict(n_layer=36, d_model=1280, n_head=20, vocab_size=50257, block_size=1024),
    "gpt2-xl": dict(n_layer=48, d_model=1600, n_head=25, vocab_size=50257, block_size=1024),
    "tiny": dict(n_layer=2, d_model=32, n_head=4, vocab_size=64, block_size=32),
}


def _check_preset(preset: str, key: str) -> dict:
  if preset and preset not in PRESETS:
    raise ConfigError(f"{key}: unknown {preset!r}; expected one of {sorted(PRESETS)}")
  return PRESETS.get(preset, {})


@register_model("gpt")
def build_gpt(preset: str = "", **fields) -> GPT:
  """`GPT(**fields)` over the preset's sizes: a key given in `fields` wins over the preset."""
  return GPT(**{**_check_preset(preset, "model.preset"), **fields})


build_gpt.model_class = GPT  # its fields are the keys `build_model` accepts besides 'preset'


def gpt_config(preset: str = "", **overrides) -> ml_collections.ConfigDict:
  """A complete `model` section (name='gpt'): every `GPT` field at its default, the preset's
  sizes, then `overrides`; dtypes by name so the section stays JSON-serialisable."""
  fields = {f.name: f.default for f in dataclasses.fields(GPT)
            if f.init and f.name not in ("parent", "name") and not f.metadata.get("runtime")}
  fields.update({k: jnp.dtype(fields[k]).name for k in ("dtype", "param_dtype")})
  fields.update(_check_preset(preset, "gpt preset"))
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise ConfigError(f"model.{unknown[0]}: unknown key for model 'gpt'; expected one of "
                     f"{sorted(fields)}")
  fields.update(overrides)
  return ml_collections.ConfigDict(dict(name="gpt", preset=preset, **fields))

