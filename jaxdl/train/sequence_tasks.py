"""Sequence tasks whose targets are only some of the positions.

Shapes: B batch, T time, V vocabulary.

  lm_masked   next-token CE weighted by batch['loss_mask'] (B, T) (1 scored, 0 not):
              loss = sum_{b,t} m_bt CE_bt / sum_{b,t} m_bt, accuracy weighted the same way
              (times the eval padding mask). For data whose scored tokens are a few answers
              among unpredictable context, e.g. `assoc_recall`'s query positions.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from jaxdl.train.tasks import Task, apply_model_aux, register_task


@register_task("lm_masked")
def lm_masked(config) -> Task:
  del config

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    logits_BxTxV, new_state, aux_loss, aux_metrics = apply_model_aux(
        apply_fn, params, model_state, batch["x"], rngs, train)
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    weight_BxT = batch["loss_mask"].astype(jnp.float32)
    if "mask" in batch:  # padded eval rows score nothing
      weight_BxT = weight_BxT * batch["mask"].astype(jnp.float32)[:, None]
    total = jnp.maximum(weight_BxT.sum(), 1.0)
    ce_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch["y"])
    correct_BxT = (jnp.argmax(logits_BxTxV, -1) == batch["y"]).astype(jnp.float32)
    loss = (ce_BxT * weight_BxT).sum() / total
    metrics = {"accuracy": (correct_BxT * weight_BxT).sum() / total, **aux_metrics}
    return loss + aux_loss, (metrics, new_state)

  return Task(loss_fn, kind="other")
