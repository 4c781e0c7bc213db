"""The `lm` loss's per-token statistics over sequence chunks, without the B x T x V logits.

Shapes: B batch, T sequence, D model width, V vocabulary, C the chunk (`train.loss_chunk`),
N = ceil(T / C) chunks.

The plain loss computes z_BxTxV = h_BxTxD W_DxV (h: the final hidden states, W: the unembedding,
`GPT(..., hidden=True)`) and keeps it, and its gradient, for the backward pass: at T = 4096 and
V = 128K that is 2 GiB a row in fp32, often the step's largest buffer. Here `lax.map` runs over the
N chunks h_BxCxD, each under `jax.checkpoint`: the forward keeps only each chunk's per-token
outputs, and the backward recomputes that chunk's logits z_BxCxV from (h_BxCxD, W), so at most
one B x C x V block (and its cotangent) is alive at a time; W's gradient sums over the chunks in
the scan's carry. Per token (the same formulas as `jaxdl.train.token_losses.next_token_ce`):

  CE_bt = log Z_bt - z_bt,y_bt,  log Z_bt = logsumexp_v z_btv,  correct_bt = [argmax_v z_btv = y_bt]

The masks, segment rules and means of the `lm` task then apply to these (B, T) arrays unchanged,
so the loss and its gradient equal the plain ones (to float rounding: the same dot products, cut
at other places). A T that C does not divide is padded to N C positions, whose outputs are
dropped; a C past T is T. Cost: one more B x T x D x V matmul in the backward (the recomputed
logits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def chunked_token_stats(h_BxTxD: jax.Array, w_DxV: jax.Array, y_BxT: jax.Array, chunk: int,
                        softcap: float = 0.0):
  """(CE_BxT, correct_BxT, log Z_BxT) of the logits h W (fp32) computed C = `chunk` positions
  at a time (module docstring). `h_BxTxD` and `w_DxV` come in the model's compute dtype; the
  matmul runs in it and its result is cast to fp32, as the model's own head does. A `softcap`
  c > 0 (Gemma 2's final_logit_softcapping, `GPT.logit_softcap`) makes the logits c tanh(hW / c),
  as the model's head does."""
  b, t, d = h_BxTxD.shape
  chunk = min(chunk, t)  # a chunk past T would only pad
  n = -(-t // chunk)
  pad = n * chunk - t
  h_NxBxCxD = jnp.pad(h_BxTxD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
  y_NxBxC = jnp.pad(y_BxT, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)

  # Saving nothing but the inputs: the backward recomputes this chunk's logits.
  @jax.checkpoint
  def one_chunk(h_BxCxD, y_BxC, w_DxV):
    z_BxCxV = (h_BxCxD @ w_DxV).astype(jnp.float32)
    if softcap:
      z_BxCxV = softcap * jnp.tanh(z_BxCxV / softcap)
    ce_BxC = optax.softmax_cross_entropy_with_integer_labels(z_BxCxV, y_BxC)
    correct_BxC = (jnp.argmax(z_BxCxV, -1) == y_BxC).astype(jnp.float32)
    return ce_BxC, correct_BxC, jax.nn.logsumexp(z_BxCxV, axis=-1)

  stats = jax.lax.map(lambda hy: one_chunk(*hy, w_DxV), (h_NxBxCxD, y_NxBxC))
  return tuple(s_NxBxC.swapaxes(0, 1).reshape(b, n * chunk)[:, :t] for s_NxBxC in stats)
