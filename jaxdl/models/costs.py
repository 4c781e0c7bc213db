"""A GPT's size and compute: its parameters, those one token uses, and its forward FLOPs per
token (`gpt_costs`), counted from the shapes `init` would create, nothing allocated. Read by the
throughput log (MFU), the benches and the course's studies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdl.models import moe
from jaxdl.models.gpt import GPT


def gpt_costs(model: GPT, seq_len: int | None = None) -> dict:
  """Parameters and forward FLOPs per token of `model` (a multiply-add is 2 FLOPs):

    params           every scalar `init` creates (counted from shapes, nothing allocated)
    active_params    the scalars one token uses: an expert weight counts K / E of its size
    flops_per_token  2 M + 4 T D L: M = the matrix weights a token multiplies (kernels, the
                     router, K / E of the experts, the head), and per layer Q K^T and the weighted
                     sum of V over T = seq_len keys (default block_size)
  An MoE's params grow with E while its FLOPs grow with K (and the E-wide router).
  """
  t = seq_len or model.block_size
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32),
                                             train=False))["params"]
  spec = model.moe_spec
  params = active = matmul = 0.0
  for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
    name = jax.tree_util.keystr(path)
    used = leaf.size * moe.active_fraction(name, spec)
    params, active = params + leaf.size, active + used
    if name.endswith(("['kernel']", "['router']", "['expert_fc']", "['expert_proj']")):
      matmul += used
  if model.tie_embeddings:
    matmul += model.vocab_size * model.d_model  # the head reuses wte
  return {"params": int(params), "active_params": int(round(active)),
          "flops_per_token": int(round(2 * matmul + 4 * t * model.d_model * model.n_layer))}
