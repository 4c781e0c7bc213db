"""An LSTM encoder-decoder, with or without additive (Bahdanau) attention.

Shapes: B batch, S source length, T target length, L = S + T input tokens, E embedding width,
N hidden units, A attention width, V vocabulary.

The input row x (B, L) holds the source x[:, :S] and the decoder's teacher-forced input
x[:, S:] (a start token, then the target shifted right); the output is next-token logits
(B, T, V) for the target. Encoder: an LSTM over the embedded source, annotations h_1..h_S and
a final state (c_S, h_S) that starts the decoder. Decoder step t, with state s_{t-1}:

  without attention   s_t = LSTM(s_{t-1}, emb(y_{t-1}))            logits_t = W_o s_t
  with attention      e_ts = v^T tanh(W_q s_{t-1} + W_k h_s)       (additive score)
                      alpha_ts = softmax_s(e_ts),  c_t = sum_s alpha_ts h_s
                      s_t = LSTM(s_{t-1}, [emb(y_{t-1}), c_t])     logits_t = W_o [s_t, c_t]

Without attention the whole source reaches the decoder through the one vector (c_S, h_S): the
bottleneck of the course; with it, every step reads all S annotations (cost O(S T A)).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.models.rnn import LSTMCell
from jaxdl.schema import NONNEG, POSITIVE, setting

Dtype = Any


class AdditiveAttention(nn.Module):
  """c = sum_s softmax_s(v^T tanh(q + k_s)) h_s for a query q = W_q s and keys k_s = W_k h_s."""

  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, q_BxA, k_BxSxA, h_BxSxN):
    v = nn.Dense(1, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype, name="v")
    e_BxS = v(jnp.tanh(q_BxA[:, None, :] + k_BxSxA))[..., 0]
    alpha_BxS = jax.nn.softmax(e_BxS.astype(jnp.float32), axis=-1)
    return jnp.einsum("bs,bsn->bn", alpha_BxS.astype(h_BxSxN.dtype), h_BxSxN), alpha_BxS


class DecoderStep(nn.Module):
  """One decoder step: ((c, h), emb_t, keys, annotations) -> ((c_t, h_t), (features, alpha))."""

  hidden: int
  attention: bool
  attn_dim: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, carry, emb_BxE, k_BxSxA, h_BxSxN):
    _, s_BxN = carry
    if not self.attention:
      carry, s_BxN = LSTMCell(self.hidden, self.dtype, self.param_dtype, name="lstm")(carry,
                                                                                     emb_BxE)
      return carry, (s_BxN, jnp.zeros(h_BxSxN.shape[:2], jnp.float32))
    q_BxA = nn.Dense(self.attn_dim, use_bias=False, dtype=self.dtype,
                     param_dtype=self.param_dtype, name="w_q")(s_BxN)
    c_BxN, alpha_BxS = AdditiveAttention(self.dtype, self.param_dtype, name="attend")(
        q_BxA, k_BxSxA, h_BxSxN)
    carry, s_BxN = LSTMCell(self.hidden, self.dtype, self.param_dtype, name="lstm")(
        carry, jnp.concatenate([emb_BxE, c_BxN], axis=-1))
    return carry, (jnp.concatenate([s_BxN, c_BxN], axis=-1), alpha_BxS)


@register_model("seq2seq")
class Seq2Seq(layers.Model):
  """LSTM encoder-decoder over tokens; see the module docstring.

  Attributes:
    vocab_size: V, shared by source and target (the start token included).
    src_len: S, the number of source tokens at the front of each input row.
    tgt_len: T, the number of target tokens after it (0: T = S, as in `digit_strings`, whose
      rows are L = 2 data.length tokens); a row of another length L != S + T is refused.
    embed_dim, hidden, attn_dim: E, N, A.
    attention: additive attention over the encoder's annotations (False: the bottleneck).
  The attention weights (B, T, S) are sown into 'intermediates' as 'alpha'.
  """

  vocab_size: int = setting(11, POSITIVE)
  src_len: int = setting(8, POSITIVE)
  tgt_len: int = setting(0, NONNEG)
  embed_dim: int = setting(32, POSITIVE)
  hidden: int = setting(64, POSITIVE)
  attn_dim: int = setting(64, POSITIVE)
  attention: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxL, *, train: bool):
    del train  # no dropout or batch statistics
    tgt_len = self.tgt_len or self.src_len
    if x_BxL.ndim != 2 or x_BxL.shape[1] != self.src_len + tgt_len:
      raise ValueError(f"model.src_len: input rows of shape {x_BxL.shape} must hold src_len + "
                       f"tgt_len = {self.src_len} + {tgt_len} tokens (the source, then the "
                       f"decoder input; digit_strings rows are 2 data.length)")
    embed = nn.Embed(self.vocab_size, self.embed_dim, dtype=self.dtype,
                     param_dtype=self.param_dtype, name="embed")
    src_BxSxE, dec_BxTxE = jnp.split(embed(x_BxL), [self.src_len], axis=1)
    scan = lambda cls, **kw: nn.scan(  # noqa: E731  time-major loops over axis 1
        cls, variable_broadcast="params", split_rngs={"params": False}, out_axes=1, **kw)
    zeros_BxN = jnp.zeros((x_BxL.shape[0], self.hidden), self.dtype)
    carry, h_BxSxN = scan(LSTMCell, in_axes=1)(self.hidden, self.dtype, self.param_dtype,
                                              name="encoder")((zeros_BxN, zeros_BxN), src_BxSxE)
    # Keys once per sequence: W_k h_s does not change across decoder steps.
    k_BxSxA = nn.Dense(self.attn_dim, dtype=self.dtype, param_dtype=self.param_dtype,
                       name="w_k")(h_BxSxN) if self.attention else h_BxSxN
    decoder = scan(DecoderStep, in_axes=(1, nn.broadcast, nn.broadcast))(
        self.hidden, self.attention, self.attn_dim, self.dtype, self.param_dtype, name="decoder")
    _, (f_BxTxF, alpha_BxTxS) = decoder(carry, dec_BxTxE, k_BxSxA, h_BxSxN)
    self.sow("intermediates", "alpha", alpha_BxTxS)
    return nn.Dense(self.vocab_size, dtype=self.dtype, param_dtype=self.param_dtype,
                    name="head")(f_BxTxF).astype(jnp.float32)


def greedy_decode(model: Seq2Seq, variables, src_BxS: jax.Array, start: int) -> jax.Array:
  """Greedy decoding: y_t = argmax_v logits_t(src, start, y_1 .. y_{t-1}) for t = 1..T, each
  step fed the model's own previous outputs (not the true target, as in teacher forcing).

  Runs the full forward once per target token on the row [src, start, y_1 .. y_{t-1}, pad]
  inside a `lax.fori_loop`; the decoder is causal in its inputs, so the padding after position
  t does not reach logits_t. Returns y int32 (B, T), T = model.tgt_len or src_len.
  """
  b, s = src_BxS.shape
  t_len = model.tgt_len or model.src_len
  x_BxL = jnp.concatenate([src_BxS.astype(jnp.int32), jnp.full((b, 1), start, jnp.int32),
                           jnp.zeros((b, t_len - 1), jnp.int32)], axis=1)

  def step(t, carry):
    x_BxL, y_BxT = carry
    y_B = jnp.argmax(model.apply(variables, x_BxL, train=False)[:, t], -1).astype(jnp.int32)
    y_BxT = y_BxT.at[:, t].set(y_B)
    # y_t is the decoder's input at step t + 1 (source S, then start at S): position S + 1 + t.
    x_BxL = jax.lax.dynamic_update_slice(x_BxL, y_B[:, None],
                                         (0, jnp.minimum(s + 1 + t, s + t_len - 1)))
    return x_BxL, y_BxT

  _, y_BxT = jax.lax.fori_loop(0, t_len, step, (x_BxL, jnp.zeros((b, t_len), jnp.int32)))
  return y_BxT
