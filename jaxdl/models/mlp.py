"""Multi-layer perceptron with optional normalization, inverted dropout and residuals.

Shapes: B batch, D input features (flattened), H hidden width, K outputs.

Block i: h = act(norm_i(dense_i(x))); inverted dropout keeps a unit with probability 1 - p and
scales it by 1 / (1 - p) in training (so E[h] is unchanged) and is the identity in eval; with
`residual`, x <- x + h whenever the widths match. Then `head` gives K logits (fp32).
`input_dropout` applies the same inverted dropout to the input features before block 0.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.schema import POSITIVE, UNIT, each, one_of, setting


@register_model("mlp")
class MLP(layers.Model):
  """Dense -> [norm] -> activation -> [dropout] blocks, then a dense head.

  Attributes:
    hidden: widths of the hidden layers (depth = len(hidden)).
    out: number of outputs K (1 for a binary logit).
    activation: a name of `layers.ACTIVATIONS`.
    norm: 'none' | 'batch' | 'layer' | 'rms' | 'group' (BatchNorm momentum 0.9 = PyTorch 0.1).
    dropout: drop probability p (inverted dropout) after each hidden layer.
    input_dropout: drop probability of the input features (inverted dropout on x itself).
    residual: add each block's input to its output when the widths match.
    init_name: kernel initializer name (`layers.get_initializer`); biases start at 0.
    bn_axis_name: the pmap axis over which BatchNorm averages its statistics.
  """

  hidden: tuple[int, ...] = setting((64, 64, 64), each(POSITIVE))
  out: int = setting(1, POSITIVE)
  activation: str = setting("relu", one_of(*layers.ACTIVATIONS))
  norm: str = setting("none", one_of(*layers.NORM_NAMES))
  dropout: float = setting(0.0, UNIT)
  input_dropout: float = setting(0.0, UNIT)
  residual: bool = False
  init_name: str = setting("lecun", one_of(*layers.INIT_NAMES))
  dtype: layers.Dtype = jnp.float32
  param_dtype: layers.Dtype = jnp.float32
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxD = x.reshape(x.shape[0], -1).astype(self.dtype)
    if self.input_dropout > 0:
      x_BxD = nn.Dropout(self.input_dropout, deterministic=not train, name="input_dropout")(x_BxD)
    act = layers.get_activation(self.activation)
    kinit = layers.get_initializer(self.init_name)
    for i, width in enumerate(self.hidden):
      h_BxH = nn.Dense(width, kernel_init=kinit, dtype=self.dtype, param_dtype=self.param_dtype,
                       name=f"dense_{i}")(x_BxD)
      h_BxH = layers.make_norm(self.norm, train=train, name=f"norm_{i}", dtype=self.dtype,
                               param_dtype=self.param_dtype, axis_name=self.bn_axis_name)(h_BxH)
      h_BxH = act(h_BxH)
      if self.dropout > 0:
        h_BxH = nn.Dropout(self.dropout, deterministic=not train)(h_BxH)
      x_BxD = x_BxD + h_BxH if self.residual and x_BxD.shape == h_BxH.shape else h_BxH
    return nn.Dense(self.out, kernel_init=kinit, dtype=self.dtype, param_dtype=self.param_dtype,
                    name="head")(x_BxD).astype(jnp.float32)
