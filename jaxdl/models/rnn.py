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

Dtype = Any


class RNNCell(nn.Module):
  """(h, x_t) -> (h_t, h_t) with h_t = tanh(W_h h + W_x x_t + b)."""

  hidden: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, h_BxN, x_BxD):
    wx = nn.Dense(self.hidden, dtype=self.dtype, param_dtype=self.param_dtype, name="wx")
    wh = nn.Dense(self.hidden, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                  kernel_init=nn.initializers.orthogonal(), name="wh")
    h_BxN = jnp.tanh(wh(h_BxN) + wx(x_BxD))
    return h_BxN, h_BxN


class LSTMCell(nn.Module):
  """((c, h), x_t) -> ((c_t, h_t), h_t) with the additive cell c_t = f c + i c~."""

  hidden: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, carry, x_BxD):
    c_BxN, h_BxN = carry
    wx = nn.Dense(4 * self.hidden, dtype=self.dtype, param_dtype=self.param_dtype, name="wx")
    wh = nn.Dense(4 * self.hidden, use_bias=False, dtype=self.dtype,
                  param_dtype=self.param_dtype, name="wh")
    i, f, g, o = jnp.split(wh(h_BxN) + wx(x_BxD), 4, axis=-1)
    c_BxN = nn.sigmoid(f) * c_BxN + nn.sigmoid(i) * jnp.tanh(g)
    h_BxN = nn.sigmoid(o) * jnp.tanh(c_BxN)
    return (c_BxN, h_BxN), h_BxN


CELLS = {"rnn": RNNCell, "lstm": LSTMCell}


class RNN(nn.Module):
  """Stacked RNN/LSTM over time; classifier (B, K) from the last step, or per-step (B, T, K).

  Inputs: floats (B, T, D); images (B, H, W[, 1]) read row by row (T = H, D = W); flat (B, T*D)
  with `seq_len`; or int tokens (B, T) when `vocab_size` > 0 (embedded to `embed_dim`).
  """

  cell: str = "lstm"
  hidden: int = 128
  num_layers: int = 1
  out: int = 10
  seq_output: bool = False
  vocab_size: int = 0
  embed_dim: int = 64
  seq_len: int = 0
  dropout: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self):
    layers.check_fields(self, sizes=("hidden", "num_layers", "out"), dropouts=("dropout",))
    super().__post_init__()

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
    if self.cell not in CELLS:
      raise ValueError(f"cell: unknown {self.cell!r}; expected one of {sorted(CELLS)}")
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
