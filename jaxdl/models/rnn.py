"""Recurrent networks over time with `nn.scan`: a plain (Elman) RNN and an LSTM.

Shapes: B batch, T time, D input features, N hidden units, K outputs, V vocabulary.

RNN:   h_t = tanh(W_h h_{t-1} + W_x x_t + b)
LSTM:  [i, f, g, o] = W_h h_{t-1} + W_x x_t + b;  i, f, o = sigmoid(.), c~ = tanh(g)
       c_t = f * c_{t-1} + i * c~_t   (the additive cell path)
       h_t = o * tanh(c_t)
"""

from __future__ import annotations

from typing import Any

import chex
import flax.linen as nn
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.schema import NONNEG, POSITIVE, UNIT, one_of, setting

Dtype = Any


class RNNCell(nn.Module):
  """(h, x_t) -> (h_t, h_t) with h_t = tanh(W_h h + W_x x_t + b)."""

  hidden: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def affine(self, h_BxN, x_BxD, width: int, **wh_kw):
    """W_h h + W_x x + b, `width` wide: every gate's pre-activation (W_h 'wh', W_x and b 'wx')."""
    wx = nn.Dense(width, dtype=self.dtype, param_dtype=self.param_dtype, name="wx")
    wh = nn.Dense(width, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                  name="wh", **wh_kw)
    return wh(h_BxN) + wx(x_BxD)

  @nn.compact
  def __call__(self, h_BxN, x_BxD):
    h_BxN = jnp.tanh(self.affine(h_BxN, x_BxD, self.hidden,
                                 kernel_init=nn.initializers.orthogonal()))
    return h_BxN, h_BxN


class LSTMCell(RNNCell):
  """((c, h), x_t) -> ((c_t, h_t), h_t) with the additive cell c_t = f c + i c~."""

  @nn.compact
  def __call__(self, carry, x_BxD):
    c_BxN, h_BxN = carry
    i, f, g, o = jnp.split(self.affine(h_BxN, x_BxD, 4 * self.hidden), 4, axis=-1)
    c_BxN = nn.sigmoid(f) * c_BxN + nn.sigmoid(i) * jnp.tanh(g)
    h_BxN = nn.sigmoid(o) * jnp.tanh(c_BxN)
    return (c_BxN, h_BxN), h_BxN


CELLS = {"rnn": RNNCell, "lstm": LSTMCell}


class RNN(layers.Model):
  """Stacked RNN/LSTM over time; classifier (B, K) from the last step, or per-step (B, T, K).

  Inputs: floats (B, T, D); images (B, H, W[, 1]) read row by row (T = H, D = W); flat (B, T*D)
  with `seq_len`; or int tokens (B, T) when `vocab_size` > 0 (embedded to `embed_dim`).
  """

  cell: str = setting("lstm", one_of(*CELLS))
  hidden: int = setting(128, POSITIVE)
  num_layers: int = setting(1, POSITIVE)
  out: int = setting(10, POSITIVE)
  seq_output: bool = False
  vocab_size: int = setting(0, NONNEG)  # 0: float inputs, else int tokens embedded
  embed_dim: int = setting(64, POSITIVE)
  seq_len: int = setting(0, NONNEG)  # T of a flat input (B, T*D)
  dropout: float = setting(0.0, UNIT)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _as_sequence(self, x):
    if self.vocab_size:
      chex.assert_rank(x, 2, custom_message="RNN: tokens must be int (B, T)")
      return nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype,
                      param_dtype=self.param_dtype, name="embed")(x)
    if x.ndim == 4:
      chex.assert_axis_dimension(x, 3, 1, custom_message="RNN: images must have one channel")
      x = x[..., 0]
    if x.ndim == 2:
      if not self.seq_len or x.shape[1] % self.seq_len:
        raise ValueError(f"RNN: flat input {x.shape} needs seq_len dividing {x.shape[1]}")
      x = x.reshape(x.shape[0], self.seq_len, -1)
    chex.assert_rank(x, 3, custom_message="RNN: expected a sequence (B, T, D)")
    return x.astype(self.dtype)

  @nn.compact
  def __call__(self, x, *, train: bool):
    h_BxTxD = self._as_sequence(x)
    for layer in range(self.num_layers):
      cell_cls = nn.scan(CELLS[self.cell], variable_broadcast="params",
                         split_rngs={"params": False}, in_axes=1, out_axes=1)
      cell = cell_cls(self.hidden, dtype=self.dtype, param_dtype=self.param_dtype,
                      name=f"{self.cell}_{layer}")
      z_BxN = jnp.zeros((h_BxTxD.shape[0], self.hidden), self.dtype)
      carry = (z_BxN, z_BxN) if self.cell == "lstm" else z_BxN
      _, h_BxTxD = cell(carry, h_BxTxD)
      h_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(h_BxTxD)
    head = nn.Dense(self.out, dtype=self.dtype, param_dtype=self.param_dtype, name="head")
    if self.seq_output:
      return head(h_BxTxD).astype(jnp.float32)
    return head(h_BxTxD[:, -1]).astype(jnp.float32)


@register_model("rnn")
def build_rnn(cell: str = "rnn", **fields) -> RNN:
  """'rnn': the `RNN` with a plain (Elman) cell unless `cell` says otherwise."""
  return RNN(cell=cell, **fields)


build_rnn.model_class = RNN
register_model("lstm")(RNN)  # the `RNN` with its default LSTM cell
