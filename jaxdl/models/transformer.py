"""The transformer block and the stack of L blocks (scanned or unrolled) that GPT, ViT and DiT
share.

Shapes: B batch, T sequence, D model width, F MLP hidden width, L layers.

Block, pre-LN (GPT-2):  x <- x + Attn(LN(x));  x <- x + MLP(LN(x))   (the stack ends with LN_f)
Block, post-LN:         x <- LN(x + Attn(x));  x <- LN(x + MLP(x))
Block, sandwich (Gemma 2): x <- x + LN'(Attn(LN(x)));  x <- x + LN'(MLP(LN(x)))   (LN' ln_*_post)
DropPath (stochastic depth, `drop_path` p): in training each residual branch of each example is
dropped whole with probability p and kept ones are scaled by 1 / (1 - p), so E[branch] holds.
MLP: c_proj(GELU(c_fc x)), or SwiGLU c_proj(silu(x W_g) * (x W_u)), or GeGLU (Gemma) with the
tanh GELU in silu's place; F = mlp_hidden, whose 0 means 4D (GELU) or 8D/3 (gated, the same
parameter count as 4D with two input matrices): `TransformerModel.mlp_width`.
Per-layer attention kinds (`local_layers`, windowed or full; GPT's attn_pattern argues the one
scan): a stack of both kinds scans each layer's kind as an (L,) value beside the KV cache.
Attention: H = n_head query heads, N = n_kv_head key/value heads (grouped-query when N < H; 0
means N = H: `TransformerModel.kv_heads`).
LoRA (`lora_spec`, `jaxdl.models.lora`): low-rank adapters beside the sites it names.
Variants: the MLP a mixture of experts (`moe_spec`, `jaxdl.models.moe`), the attention a
selective state-space mixer (`ssm_spec`, `jaxdl.models.ssm`), each in the same residual slot.
Settings: GPT, ViT and DiT subclass `TransformerModel`, whose fields are the shared `model`
keys; the blocks receive them as one hashable `BlockSpec` (`cfg`), read from the model's
attributes.
The stack of L blocks (`stack_blocks`, `apply_blocks`; scan, remat, the two parameter layouts)
is `jaxdl.models.stack`'s; `REMAT_POLICIES`, the `model.remat` names, are here.
The patch embedding ViT and DiT put before the stack is `jaxdl.models.patches`'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import attention, layers, lora, moe, ring_attention, ssm
from jaxdl.models import rope as rope_lib
from jaxdl.schema import NONNEG, POSITIVE, UNIT, Check, fail, one_of, runtime, setting

Dtype = Any

# model.remat -> the `jax.checkpoint` policy of each block (None: no remat; 'full' saves nothing).
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "offload": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}


def _remat_message(value) -> str:
  """model.remat's one line; the old on/off switch is named by its new spelling."""
  names = ", ".join(map(repr, REMAT_POLICIES))
  if isinstance(value, bool) or str(value).lower() in ("true", "false"):
    on = value if isinstance(value, bool) else value.lower() == "true"
    return (f"is a policy name now ({names}); the old {on} is "
            f"{'full' if on else 'none'!r}, got {value!r}")
  return f"expected one of {names}, got {value!r}"


class TransformerModel(layers.Model):
  """The settings GPT and ViT share: the blocks' and the stack's. The defaults are GPT-2's; a
  subclass redeclares a field only to change its default (its check stays)."""

  causal: ClassVar[bool] = True  # attention sees only earlier tokens
  n_layer: int = setting(4, POSITIVE)
  n_head: int = setting(4, POSITIVE)
  # Key/value heads N (grouped-query attention, `jaxdl.models.attention`): 0 means N = n_head;
  # N must divide n_head (1: multi-query). The KV cache holds N heads.
  n_kv_head: int = setting(0, NONNEG)
  d_model: int = setting(128, POSITIVE)
  mlp: str = setting("gelu", one_of("gelu", "swiglu", "geglu"))
  mlp_hidden: int = setting(0, NONNEG)  # F; 0: 4 D (gelu) or 8 D / 3 (swiglu, geglu)
  # 'rms1p': RMSNorm scaled by (1 + w), w initialised at 0 (Gemma); q/k norms follow it.
  norm: str = setting("layer", one_of("layer", "rms", "rms1p"))
  ln: str = setting("pre", one_of("pre", "post", "sandwich"))
  dropout: float = setting(0.0, UNIT, run_choice=True)
  attn_dropout: float = setting(0.0, UNIT, run_choice=True)
  # Stochastic depth: in training each block's residual branches are dropped whole per example
  # with this probability (kept ones scaled by 1 / (1 - p)); the identity at eval. Off: 0.
  drop_path: float = setting(0.0, UNIT, run_choice=True)
  qk_norm: bool = False
  # K, the width of a query/key/value head: 0 means d_model / n_head; set, the queries are H K
  # wide whatever D is (Qwen3, Gemma) and the output projection maps H K back to D.
  head_dim: int = setting(0, NONNEG)
  use_bias: bool = True
  scan_layers: bool = True
  # Layers per scan iteration: > 1 trades a little compile time for fewer loop-carried copies
  # (the params stay stacked under 'h' either way, so checkpoints do not change).
  scan_unroll: int = setting(1, POSITIVE, run_choice=True)
  # Rematerialization policy of every block (module docstring; `REMAT_POLICIES`).
  remat: str = setting("none", Check(lambda v: v in REMAT_POLICIES, _remat_message,
                                     explains_type=True), run_choice=True)
  attn_impl: str = setting("auto", one_of(*attention.ATTN_IMPLS), run_choice=True)
  init_name: str = setting("gpt2", one_of(*layers.INIT_NAMES))
  epsilon: float = setting(1e-5, POSITIVE)
  dtype: Dtype = setting(jnp.float32, run_choice=True)
  param_dtype: Dtype = setting(jnp.float32, run_choice=True)
  sequence: ring_attention.SequenceSpec | None = runtime()  # set under parallel.sequence > 1

  # The variants a subclass may switch on (`BlockSpec`): off here.
  rope: ClassVar[bool] = False
  rope_spec: ClassVar[rope_lib.RopeSpec] = rope_lib.RopeSpec()  # the RoPE frequencies
  sliding_window: ClassVar[int] = 0  # W > 0: causal attention sees only the W latest tokens
  local_rope: ClassVar[rope_lib.RopeSpec | None] = None  # the windowed layers' own RoPE
  attn_scale_dim: ClassVar[float] = 0.0  # logits / sqrt(attn_scale_dim), 0: K; then softcap
  attn_softcap: ClassVar[float] = 0.0
  qkv_bias: ClassVar[bool] = False  # Q/K/V biases even with use_bias off (Qwen2)
  attn_bias: ClassVar[bool] = False  # Q/K/V/O biases even with use_bias off (Llama's)
  mlp_bias: ClassVar[bool] = False  # MLP biases even with use_bias off (Llama's)
  moe_spec: ClassVar[moe.MoeSpec | None] = None
  ssm_spec: ClassVar[ssm.SsmSpec | None] = None
  lora_spec: ClassVar[lora.LoraSpec | None] = None

  def check(self):
    if self.remat == "offload" and jax.default_backend() == "cpu":
      fail("model.", "remat", "'offload' moves saved activations to host memory, and the cpu "
           "backend's device memory is the host's; use 'dots_no_batch' (the same saved dots, "
           "kept), got 'offload'")
    if self.ssm_spec is None and self.d_model % self.n_head and not self.head_dim:
      fail("model.", "d_model", f"must be divisible by n_head={self.n_head} (heads of equal "
           f"width), got {self.d_model}")
    if self.ssm_spec is None and self.n_head % self.kv_heads:
      fail("model.", "n_kv_head", f"must divide n_head={self.n_head} (each key/value head "
           f"serves n_head / n_kv_head query heads), got {self.n_kv_head}")

  @property
  def kv_heads(self) -> int:
    """N, the key/value heads: n_kv_head, or n_head when it is 0 (the one place that reads 0 so;
    the blocks, the KV cache, LoRA, the HF tables and the sharding rules all take N from here)."""
    return self.n_kv_head or self.n_head

  @property
  def head_width(self) -> int:
    """K, the head width: head_dim, or d_model / n_head when it is 0 (the one place; the blocks,
    the KV cache, LoRA and the HF tables take K from here)."""
    return self.head_dim or self.d_model // self.n_head

  @property
  def mlp_width(self) -> int:
    """F, the MLP hidden width: mlp_hidden, or when it is 0 4 D (GELU) or 8 D / 3 (SwiGLU: its
    three D x F matrices hold as many parameters as GELU's two D x 4D ones). The one place."""
    return self.mlp_hidden or (4 * self.d_model if self.mlp == "gelu" else 8 * self.d_model // 3)

  @property
  def local_layers(self) -> tuple[bool, ...]:
    """Per layer, whether its attention is windowed (here: all iff sliding_window > 0)."""
    return (bool(self.sliding_window),) * self.n_layer

  @property
  def block_spec(self) -> BlockSpec:
    return BlockSpec.of(self)


@dataclasses.dataclass(frozen=True)
class BlockSpec:
  """What one block reads: a model's settings in one hashable value, so a block (and its MLP,
  MoE and SSM) takes one `cfg` field instead of restating every setting and its default."""

  n_head: int
  n_kv_head: int  # N, resolved: the model's kv_heads (never 0 here)
  head_dim: int  # K, resolved: the model's head_width (never 0 here)
  causal: bool
  n_residual: int  # residual branches in the stack, 2 L: scales the output projections' init
  mlp: str
  mlp_hidden: int  # F, resolved: the model's mlp_width (never 0 here)
  norm: str
  ln: str
  dropout: float
  attn_dropout: float
  drop_path: float
  rope: bool
  rope_spec: rope_lib.RopeSpec
  local_rope: rope_lib.RopeSpec | None  # the local layers' RoPE when it differs (None: rope_spec)
  sliding_window: int  # W, resolved: 0 when no layer is local
  mixed_layers: bool  # local and global layers both: the block takes its kind per layer
  attn_scale_dim: float
  attn_softcap: float
  qk_norm: bool
  use_bias: bool
  qkv_bias: bool
  attn_bias: bool
  mlp_bias: bool
  attn_impl: str
  init_name: str
  epsilon: float
  moe_spec: moe.MoeSpec | None  # the MLP is a mixture of experts (`jaxdl.models.moe`)
  ssm_spec: ssm.SsmSpec | None  # the token mixer is a selective SSM (`jaxdl.models.ssm`)
  lora_spec: lora.LoraSpec | None  # low-rank adapters (`jaxdl.models.lora`)
  sequence: ring_attention.SequenceSpec | None  # the sequence split over devices
  dtype: Dtype
  param_dtype: Dtype

  @classmethod
  def of(cls, model: TransformerModel) -> BlockSpec:
    """`model`'s attributes of the same names, with N, K and F resolved (`kv_heads`,
    `head_width`, `mlp_width`), the layer kinds from `local_layers`;
    n_residual = 2 L (attention and MLP per block)."""
    local = model.local_layers
    derived = dict(n_kv_head=model.kv_heads, head_dim=model.head_width,
                   mlp_hidden=model.mlp_width, n_residual=2 * model.n_layer,
                   sliding_window=model.sliding_window if any(local) else 0,
                   mixed_layers=any(local) and not all(local))
    return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(cls)
                  if f.name not in derived}, **derived)

  @property
  def kernel_init(self) -> Callable:
    return layers.get_initializer(self.init_name)

  @property
  def out_init(self) -> Callable:
    """The init of a projection closing a residual branch ('gpt2': std 0.02 / sqrt(2 L))."""
    return layers.residual_out_init(self.init_name, self.n_residual)

  def make_norm(self, name: str, train: bool) -> Callable:
    return layers.make_norm(self.norm, train=train, name=name, epsilon=self.epsilon,
                            dtype=self.dtype, param_dtype=self.param_dtype)


class MlpBlock(nn.Module):
  """c_proj(GELU(c_fc x)); or SwiGLU: c_fc gives [gate, up], c_proj(silu(gate) * up); GeGLU
  the same with the tanh GELU for silu (Gemma's gelu_pytorch_tanh). F is `cfg.mlp_hidden`
  (resolved by `TransformerModel.mlp_width`).

  GELU is the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as in GPT-2.
  """

  cfg: BlockSpec

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg, d = self.cfg, x_BxTxD.shape[-1]
    dense = functools.partial(nn.Dense, use_bias=cfg.use_bias or cfg.mlp_bias, dtype=cfg.dtype,
                              param_dtype=cfg.param_dtype)

    def adapted(layer, site, h_BxTxN):  # layer(h), plus the site's LoRA delta when adapted
      delta = lora.adapter(cfg.lora_spec, site, layer.features, cfg.dtype, cfg.param_dtype)
      return layer(h_BxTxN) if delta is None else layer(h_BxTxN) + delta(h_BxTxN)

    f = cfg.mlp_hidden
    if cfg.mlp == "gelu":
      h_BxTxF = nn.gelu(adapted(dense(f, kernel_init=cfg.kernel_init, name="c_fc"), "mlp/c_fc",
                                x_BxTxD), approximate=True)
    else:  # swiglu, geglu
      gate, up = jnp.split(adapted(dense(2 * f, kernel_init=cfg.kernel_init, name="c_fc"),
                                   "mlp/c_fc", x_BxTxD), 2, axis=-1)
      act = nn.silu if cfg.mlp == "swiglu" else functools.partial(nn.gelu, approximate=True)
      h_BxTxF = act(gate) * up
    return adapted(dense(d, kernel_init=cfg.out_init, name="c_proj"), "mlp/c_proj", h_BxTxF)


class Block(nn.Module):
  """One transformer block; `__call__(x, cache, pos, mask, positions, segment_ids, local) ->
  (x, new_cache)` (scan-friendly). `local`: this layer's kind, a traced bool, in a stack of
  both kinds (`cfg.mixed_layers`), else None. `mask` (B, 1, T, S) bool narrows attention
  beyond causality; `positions` (B, T) are the RoPE positions when given. `segment_ids` (B, T)
  keep packed documents apart in either mixer: attention also needs segment_ids[s] =
  segment_ids[t], the SSM restarts its state and convolution at each document's start
  (`jaxdl.models.ssm`). The MLP (and an MoE's experts) act token by token, so they need
  nothing; an MoE's capacity is shared by the batch, though (`jaxdl.models.moe`).
  """

  cfg: BlockSpec
  train: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, cache=None, pos=0, mask=None, positions=None, segment_ids=None,
               local=None):
    cfg, train = self.cfg, self.train
    if cfg.ssm_spec is not None and mask is not None:
      raise ValueError("Block: model.mixer='ssm' cannot apply an attention mask; packed documents "
                       "pass segment_ids")
    if segment_ids is not None and cfg.ssm_spec is None and cfg.sequence is None:
      seg_Bx1xTxT = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
      mask = seg_Bx1xTxT if mask is None else jnp.logical_and(mask, seg_Bx1xTxT)
    dropout = nn.Dropout(cfg.dropout, deterministic=not train)
    if cfg.drop_path > 0:  # one keep/drop draw per example, broadcast over (T, D)
      path = nn.Dropout(cfg.drop_path, broadcast_dims=(1, 2), deterministic=not train,
                        name="drop_path")
      drop = lambda h: path(dropout(h))  # noqa: E731
    else:
      drop = dropout

    def attend(h_BxTxD):
      if cfg.ssm_spec is not None:  # the same residual slot; its cache is the state (h, tail)
        mix = ssm.SelectiveSSM(h_BxTxD.shape[-1], cfg, name="ssm")
        if cache is None:
          return mix(h_BxTxD, segment_ids=segment_ids), None
        y_BxTxD, (h_BxExN, tail_BxKm1xE) = mix(h_BxTxD, (cache["h"], cache["conv"]))
        return y_BxTxD, {"h": h_BxExN, "conv": tail_BxKm1xE}
      attn = attention.MultiHeadAttention(
          n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, causal=cfg.causal,
          window=cfg.sliding_window, qk_norm=cfg.qk_norm,
          qk_norm_kind="rms1p" if cfg.norm == "rms1p" else "rms", rope=cfg.rope,
          rope_spec=cfg.rope_spec, local_rope=cfg.local_rope, scale_dim=cfg.attn_scale_dim,
          softcap=cfg.attn_softcap, head_dim=cfg.head_dim, qk_epsilon=cfg.epsilon,
          use_bias=cfg.use_bias, qkv_bias=cfg.qkv_bias, attn_bias=cfg.attn_bias,
          attn_dropout=cfg.attn_dropout, impl=cfg.attn_impl, kernel_init=cfg.kernel_init,
          out_init=cfg.out_init, lora=cfg.lora_spec, dtype=cfg.dtype,
          param_dtype=cfg.param_dtype, sequence=cfg.sequence, name="attn")
      if cache is None:
        return attn(h_BxTxD, train=train, pos=pos, mask=mask, positions=positions,
                    local=local, segment_ids=segment_ids if cfg.sequence else None), None
      y_BxTxD, aux = attn(h_BxTxD, train=train, cache=cache, pos=pos, mask=mask,
                          positions=positions, local=local)
      return y_BxTxD, aux["cache"]

    mlp = (MlpBlock if cfg.moe_spec is None else moe.MoeMlp)(cfg, name="mlp")
    if cfg.ln != "post":  # pre; sandwich also norms each branch's output before the sum
      out = ((lambda name, h: cfg.make_norm(name, train)(h)) if cfg.ln == "sandwich"
             else lambda name, h: h)
      a_BxTxD, new_cache = attend(cfg.make_norm("ln_1", train)(x_BxTxD))
      x_BxTxD = x_BxTxD + drop(out("ln_1_post", a_BxTxD))
      x_BxTxD = x_BxTxD + drop(out("ln_2_post", mlp(cfg.make_norm("ln_2", train)(x_BxTxD))))
    else:  # post
      a_BxTxD, new_cache = attend(x_BxTxD)
      x_BxTxD = cfg.make_norm("ln_1", train)(x_BxTxD + drop(a_BxTxD))
      x_BxTxD = cfg.make_norm("ln_2", train)(x_BxTxD + drop(mlp(x_BxTxD)))
    return x_BxTxD, new_cache
