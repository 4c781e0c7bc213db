"""Sequence tasks whose targets are only some of the positions.

Shapes: B batch, T time, V vocabulary.

  lm_masked   next-token CE weighted by batch['loss_mask'] (B, T) (1 scored, 0 not):
              loss = sum_{b,t} m_bt CE_bt / sum_{b,t} m_bt, accuracy weighted the same way
              (times the eval padding mask). For data whose scored tokens are a few answers
              among unpredictable context, e.g. `assoc_recall`'s query positions.
"""

from __future__ import annotations


from jaxdl.train.tasks import Task, apply_model_aux, register_task, weighted_ce


@register_task("lm_masked")
def lm_masked(config) -> Task:
  del config

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    logits_BxTxV, new_state, aux_loss, aux_metrics = apply_model_aux(
        apply_fn, params, model_state, batch["x"], rngs, train)
    loss, accuracy = weighted_ce(logits_BxTxV, batch["y"], batch["loss_mask"], batch)
    metrics = {"accuracy": accuracy, **aux_metrics}
    return loss + aux_loss, (metrics, new_state)

  return Task(loss_fn, kind="other")
