"""Multi-layer perceptron with optional normalization, inverted dropout and residuals.

Shapes: B batch, D input features (flattened), H hidden width, K outputs.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import register_model

_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "tanh": jnp.tanh, "silu": nn.silu}


class MLP(nn.Module):
  """Dense -> [norm] -> activation -> [dropout] blocks, then a dense head.

  Attributes:
    hidden: widths of the hidden layers.
    out: number of outputs K (1 for a binary logit).
    norm: 'none' | 'batch' | 'layer' | 'rms'.
    dropout: drop probability p; kept units are scaled by 1/(1-p) in training.
  """

  hidden: Sequence[int] = (64, 64, 64)
  out: int = 1
  activation: str = "relu"
  norm: str = "none"
  dropout: float = 0.0
  residual: bool = False
  dtype: jnp.dtype = jnp.float32
  # Set to the pmap axis name so BatchNorm averages its statistics across devices.
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxD = x.reshape(x.shape[0], -1).astype(self.dtype)
    act = _ACTIVATIONS[self.activation]
    for i, width in enumerate(self.hidden):
      h_BxH = nn.Dense(width, dtype=self.dtype, name=f"dense_{i}")(x_BxD)
      if self.norm == "batch":
        h_BxH = nn.BatchNorm(use_running_average=not train, momentum=0.9,
                             axis_name=self.bn_axis_name, name=f"norm_{i}")(h_BxH)
      elif self.norm == "layer":
        h_BxH = nn.LayerNorm(name=f"norm_{i}")(h_BxH)
      elif self.norm == "rms":
        h_BxH = nn.RMSNorm(name=f"norm_{i}")(h_BxH)
      h_BxH = act(h_BxH)
      if self.dropout > 0:
        h_BxH = nn.Dropout(self.dropout, deterministic=not train)(h_BxH)
      x_BxD = x_BxD + h_BxH if self.residual and x_BxD.shape == h_BxH.shape else h_BxH
    return nn.Dense(self.out, dtype=self.dtype, name="head")(x_BxD).astype(jnp.float32)


@register_model("mlp")
def build_mlp(cfg) -> MLP:
  return MLP(hidden=tuple(cfg.hidden), out=cfg.out, activation=cfg.get("activation", "relu"),
             norm=cfg.get("norm", "none"), dropout=cfg.get("dropout", 0.0),
             residual=cfg.get("residual", False))
