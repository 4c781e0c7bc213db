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

With `groups` = G > 1 (a sequence split over G devices, `parallel.sequence`: device g holds
positions [g T / G, (g + 1) T / G)) the chunks are cut within each group and the map runs over
the N / G chunk indices of a group, the G groups side by side (h as N/G x B x G x C x D): each
device computes only its own positions' logits, one B x C x V block at a time, instead of the
map gathering h and every device computing every chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def chunked_token_stats(h_BxTxD: jax.Array, w_DxV: jax.Array, y_BxT: jax.Array, chunk: int,
                        softcap: float = 0.0, groups: int = 1):
  """(CE_BxT, correct_BxT, log Z_BxT) of the logits h W (fp32) computed C = `chunk` positions
  at a time (module docstring), within each of `groups` G contiguous groups of T / G positions.
  `h_BxTxD` and `w_DxV` come in the model's compute dtype; the matmul runs in it and its result
  is cast to fp32, as the model's own head does. A `softcap` c > 0 (Gemma 2's
  final_logit_softcapping, `GPT.logit_softcap`) makes the logits c tanh(hW / c), as the model's
  head does."""
  b, t, d = h_BxTxD.shape
  g = groups if groups > 1 and t % groups == 0 else 1
  tg = t // g
  chunk = min(chunk, tg)  # a chunk past T / G would only pad
  n = -(-tg // chunk)  # chunks per group
  pad = n * chunk - tg
  h_NxBxGxCxD = jnp.pad(h_BxTxD.reshape(b, g, tg, d), ((0, 0), (0, 0), (0, pad), (0, 0))
                        ).reshape(b, g, n, chunk, d).transpose(2, 0, 1, 3, 4)
  y_NxBxGxC = jnp.pad(y_BxT.reshape(b, g, tg), ((0, 0), (0, 0), (0, pad))
                      ).reshape(b, g, n, chunk).transpose(2, 0, 1, 3)

  # Saving nothing but the inputs: the backward recomputes this chunk's logits.
  @jax.checkpoint
  def one_chunk(h_BxGxCxD, y_BxGxC, w_DxV):
    z_BxGxCxV = (h_BxGxCxD @ w_DxV).astype(jnp.float32)
    if softcap:
      z_BxGxCxV = softcap * jnp.tanh(z_BxGxCxV / softcap)
    ce_BxGxC = optax.softmax_cross_entropy_with_integer_labels(z_BxGxCxV, y_BxGxC)
    correct_BxGxC = (jnp.argmax(z_BxGxCxV, -1) == y_BxGxC).astype(jnp.float32)
    return ce_BxGxC, correct_BxGxC, jax.nn.logsumexp(z_BxGxCxV, axis=-1)

  stats = jax.lax.map(lambda hy: one_chunk(*hy, w_DxV), (h_NxBxGxCxD, y_NxBxGxC))
  return tuple(s_NxBxGxC.transpose(1, 2, 0, 3).reshape(b, g, n * chunk)[:, :, :tg].reshape(b, t)
               for s_NxBxGxC in stats)
