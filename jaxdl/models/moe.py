"""Mixture of experts: a transformer MLP replaced by E expert MLPs, each token sent to its top k.

Shapes: N tokens (B T flattened), D model width, F expert hidden width, E experts, K = top_k
choices per token, C expert capacity (tokens per expert).

  router   z = x W_r (fp32),  p = softmax(z) over E
  choose   (g_1..g_K, e_1..e_K) = top_k(p); the gates g are the router probabilities (not
           renormalized, as in Switch), so the router learns through them
  capacity C = ceil(capacity_factor K N / E); the first C choices routed to an expert are kept
           (all first choices before any second choice), the rest dropped (their term is 0)
  experts  y = sum_k g_k [kept] W2_{e_k} GELU(W1_{e_k} x)   (GELU tanh form, no biases)
  balance  L_bal = E sum_e f_e P_e, f_e = fraction of the N K choices sent to e, P_e = mean_n p_ne
           (1 at perfect balance; Switch Transformer)
  z-loss   L_z = mean_n (logsumexp_e z_ne)^2 (keeps router logits small; ST-MoE)

Capacity couples tokens. Every term above is per token except `kept`: C and the slots count
the choices of all N tokens of the batch (rows, packed documents and, for second choices, later
tokens too), so a token's output can depend on other documents and on its own future. With
capacity_factor >= E / K, C = N and nothing can be dropped (an expert holds at most one choice
per token): the layer is then exactly token by token, and each packed document gets the output
it gets alone.

Dispatch is by index: each kept choice is scattered to its slot (e, position) of an (E, C, D)
buffer and gathered back, O(N K D) data movement; a one-hot (N, E, C) dispatch einsum would cost
O(N E C D) = O(cf K N^2 D), quadratic in the tokens of a batch (`jaxdl bench --only
moe_dispatch`, one layer's forward + backward on CPU: one-hot 2.4x the index dispatch's time at
N = 512 tokens, 7.0x at N = 2048).

The layer sows its terms into the 'aux' collection (only when 'aux' is mutable, never at init):
'loss' = balance_coef L_bal + z_coef L_z, and 'balance', 'z', 'dropped' (fraction of choices
over capacity) and 'load' (f_e E, per expert; 1 is balanced). `aux_summary` reduces a model's
'aux' tree to the scalar loss the task adds and per-step metrics.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any
AUX = "aux"


@dataclasses.dataclass(frozen=True)
class MoeSpec:
  """The routing of a mixture of experts (hashable, so it can be a module field); the GPT builds
  it from its moe_* fields. `route` and `capacity` read no loss weight: 0 there means no aux loss.
  """
  experts: int
  top_k: int
  capacity_factor: float
  balance_coef: float = 0.0
  z_coef: float = 0.0

  def capacity(self, num_tokens: int) -> int:
    """C = ceil(capacity_factor K N / E), at least 1 and at most N."""
    c = math.ceil(self.capacity_factor * self.top_k * num_tokens / self.experts)
    return max(1, min(num_tokens, c))


def route(z_NxE: jax.Array, spec: MoeSpec, capacity: int):
  """Top-k routing with capacity. Returns (expert_KxN, slot_KxN, gate_KxN, kept_KxN, terms).

  Choice k of token n goes to expert e = expert[k, n] at slot[k, n] of that expert's buffer;
  `kept` is 0 for choices past the capacity. `terms` holds the balance and z losses, the dropped
  fraction and the load f_e E.
  """
  n, e = z_NxE.shape
  p_NxE = jax.nn.softmax(z_NxE, axis=-1)
  gate_NxK, expert_NxK = jax.lax.top_k(p_NxE, spec.top_k)
  expert_KxN, gate_KxN = expert_NxK.T, gate_NxK.T
  onehot_KNxE = jax.nn.one_hot(expert_KxN.reshape(-1), e, dtype=jnp.int32)
  # Slot = how many earlier choices (first choices of all tokens, then second choices...) went
  # to the same expert.
  slot_KN = jnp.sum((jnp.cumsum(onehot_KNxE, axis=0) - 1) * onehot_KNxE, axis=-1)
  slot_KxN = slot_KN.reshape(spec.top_k, n)
  kept_KxN = (slot_KxN < capacity).astype(jnp.float32)
  f_E = jnp.mean(onehot_KNxE.astype(jnp.float32), axis=0)
  terms = {"balance": e * jnp.sum(f_E * jnp.mean(p_NxE, axis=0)),
           "z": jnp.mean(jax.nn.logsumexp(z_NxE, axis=-1) ** 2),
           "dropped": 1.0 - jnp.mean(kept_KxN),
           "load": f_E * e}
  return expert_KxN, slot_KxN, gate_KxN, kept_KxN, terms


class MoeMlp(nn.Module):
  """E expert GELU MLPs behind a top-k router (module docstring); x (..., D) -> (..., D).

  `cfg` is the block's settings (`transformer.BlockSpec`): its `moe_spec`, `mlp_hidden` (F,
  resolved by `TransformerModel.mlp_width`: 4 D when the setting is 0), initializers and dtypes.
  """

  cfg: Any

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg, spec = self.cfg, self.cfg.moe_spec
    d = x_BxTxD.shape[-1]
    f, e = cfg.mlp_hidden, spec.experts
    x_NxD = x_BxTxD.reshape(-1, d)
    n = x_NxD.shape[0]
    capacity = spec.capacity(n)
    # Expert weights are 'expert_*' with the expert axis third from last (the `expert` mesh axis
    # shards that axis; see `jaxdl.train.sharding_rules.param_spec`).
    w_r = self.param("router", cfg.kernel_init, (d, e), cfg.param_dtype)
    w1_ExDxF = self.param("expert_fc", _batched(cfg.kernel_init), (e, d, f), cfg.param_dtype)
    w2_ExFxD = self.param("expert_proj", _batched(cfg.out_init), (e, f, d), cfg.param_dtype)
    z_NxE = jnp.dot(x_NxD.astype(jnp.float32), w_r.astype(jnp.float32))
    expert_KxN, slot_KxN, gate_KxN, kept_KxN, terms = route(z_NxE, spec, capacity)
    x_NxD = x_NxD.astype(cfg.dtype)
    buf_ExCxD = jnp.zeros((e, capacity, d), cfg.dtype).at[expert_KxN, slot_KxN].set(
        jnp.broadcast_to(x_NxD, (spec.top_k, n, d)), mode="drop")
    h_ExCxF = nn.gelu(jnp.einsum("ecd,edf->ecf", buf_ExCxD, w1_ExDxF.astype(cfg.dtype)),
                      approximate=True)
    out_ExCxD = jnp.einsum("ecf,efd->ecd", h_ExCxF, w2_ExFxD.astype(cfg.dtype))
    # A dropped choice's slot is out of range: gather a clipped slot and weight it by 0.
    y_KxNxD = out_ExCxD[expert_KxN, jnp.minimum(slot_KxN, capacity - 1)]
    w_KxN = (gate_KxN * kept_KxN).astype(cfg.dtype)
    y_NxD = jnp.einsum("kn,knd->nd", w_KxN, y_KxNxD)
    if self.is_mutable_collection(AUX) and not self.is_initializing():
      loss = spec.balance_coef * terms["balance"] + spec.z_coef * terms["z"]
      for name, value in {"loss": loss, **terms}.items():
        self.sow(AUX, name, value)
    return y_NxD.reshape(x_BxTxD.shape)


def _batched(init):
  """An initializer of (E, fan_in, fan_out) that initializes each expert as one (in, out) matrix
  (the fans of a plain kernel, not counting E)."""

  def f(key, shape, dtype=jnp.float32):
    keys = jax.random.split(key, shape[0])
    return jnp.stack([init(k, shape[1:], dtype) for k in keys])

  return f


def aux_summary(aux) -> tuple[jax.Array, dict]:
  """The task's view of a model's 'aux' tree: (sum of every layer's 'loss', metrics).

  Metrics are means over layers: moe_balance, moe_z, moe_dropped, and moe_load_max /
  moe_load_min (f_e E; 1 = every expert gets its share).
  """
  found: dict[str, list] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(aux):
    name = next(str(k.key) for k in reversed(path) if isinstance(k, jax.tree_util.DictKey))
    found.setdefault(name, []).append(jnp.asarray(leaf, jnp.float32))
  if not found:
    return jnp.zeros((), jnp.float32), {}
  # Scanned blocks sow one value per layer along a leading axis, unrolled ones one leaf each:
  # flatten to (layers,) for the scalars and (layers, E) for the load.
  per_layer = {k: jnp.concatenate([v.reshape(-1, *v.shape[-1:]) if k == "load" else v.reshape(-1)
                                   for v in vs]) for k, vs in found.items()}
  metrics = {f"moe_{k}": jnp.mean(per_layer[k]) for k in ("balance", "z", "dropped")}
  load_LxE = per_layer["load"]
  metrics["moe_load_max"] = jnp.mean(jnp.max(load_LxE, axis=-1))
  metrics["moe_load_min"] = jnp.mean(jnp.min(load_LxE, axis=-1))
  return jnp.sum(per_layer["loss"]), metrics


def active_fraction(path: str, spec: MoeSpec | None) -> float:
  """The fraction of a parameter one token multiplies: K / E for expert weights, else 1."""
  return spec.top_k / spec.experts if spec is not None and "expert_" in path else 1.0
