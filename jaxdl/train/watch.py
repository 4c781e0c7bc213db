"""Health signals of a running job (`train.watch`, every `train.watch_every` = K steps).

The course's debugging table names what to look at around a loss spike: per-layer gradient
norms, the size of the Adam update relative to the weights, the largest attention logit and the
output logits. For each parameter group g (a top-level module; each layer of a scanned stack
'h' is its own group), on steps s with s % K == 0:

  cheap     param_norm/g   = ||theta_g||_2           (after the update)
            grad_norm/g    = ||grad_g||_2            (before clipping)
            update_ratio/g = ||theta_g' - theta_g||_2 / ||theta_g||_2   (the applied update)
  detailed  the above, and one extra forward pass on that step's batch (eval mode) with the
            'watch' collection mutable: attn_max_logit/<layer> = max over b, h, t, s of
            q_t . k_s / sqrt(d_head) where the mask allows (sown by the attention module only
            when 'watch' is mutable, so the train step never computes it), and the output
            logits' logit_max = max z and logit_std = std z; for a model with ReLUs,
            dead_relu/<layer> = the fraction of its units c (last axis: a feature or a conv
            channel) with relu(h)_{b,...,c} = 0 for every example b (and position) of the batch.
            The ReLUs are found in the probe's traced forward (`jax.nn.relu` calls, named by
            the module that produced their input; `jaxdl.train.xla_cpu.with_relu_inputs`, the
            one module that evaluates jaxprs), so no model code changes and the train step
            never computes them; ReLUs inside a scan or remat body are not seen.

The cheap signals are computed inside the train step under `lax.cond(s % K == 0)` and returned
as one vector (one array to read back, not one per group), so an unwatched step adds a branch
and nothing else. Records go to the 'watch' split of metrics.jsonl and TensorBoard.

Measured (char_gpt shrunk to 2 layers x 64, batch 16 x 32, constant lr, detailed every 5 steps,
150 steps): at lr 0.03 without qk-norm layer 0's largest attention logit went 2.3 (step 5) ->
77.6 (step 20) -> 1226 (step 150) and `jaxdl doctor --history` named 'attention logits growing'
at step 20; with model.qk_norm=True at the same lr it stayed <= 10.4, and at lr 0.003 without
qk-norm <= 12.3 (loss 2.52 at step 130; 2.6-3.3 over steps 100-150 at lr 0.03); neither was named.
"""

from __future__ import annotations

import logging
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.optim import tree_reductions
from jaxdl.train import xla_cpu
from jaxdl.train.tasks import Family

log = logging.getLogger("jaxdl")

STACKED = "h"          # the scanned transformer stack (`jaxdl.models.stack.apply_blocks`)
COLLECTION = "watch"   # what the attention module sows into, only when it is mutable
PROBED = (Family.CLASSIFICATION, Family.BINARY, Family.LM)  # the families with logits


def _stacked_layers(model) -> int:
  return int(model.n_layer) if getattr(model, "scan_layers", None) else 0


def group_names(params, n_stacked: int) -> list[str]:
  """The parameter groups, in the order `group_sq_norms` returns them."""
  names = []
  for key in sorted(params):  # sorted, as jit flattens dicts: names and values line up
    if key == STACKED and n_stacked:
      names += [f"{key}/{i}" for i in range(n_stacked)]
    else:
      names.append(str(key))
  return names


def group_sq_norms(tree, n_stacked: int) -> jax.Array:
  """sum of x^2 over each group's leaves, as one float32 vector (per layer for the stack)."""
  # A few reductions per group, not one per leaf (`jaxdl.optim.tree_reductions`).
  return jnp.concatenate([
      jnp.reshape(tree_reductions.sum_of_squares(tree[key], rows=key == STACKED and n_stacked > 0),
                  (-1,))
      for key in sorted(tree)])


def make_health(params, model, every: int) -> tuple[list[str], Callable]:
  """(names, health(step, params, grads, new_params) -> vector) for the train step.

  `step` is the state's step before the update, so update s + 1 is watched when
  (s + 1) % every == 0; other steps return zeros without computing anything.
  """
  n = _stacked_layers(model)
  groups = group_names(params, n)
  names = ([f"param_norm/{g}" for g in groups] + [f"grad_norm/{g}" for g in groups] +
           [f"update_ratio/{g}" for g in groups])

  def compute(params, grads, new_params):
    p = jnp.sqrt(group_sq_norms(new_params, n))
    g = jnp.sqrt(group_sq_norms(grads, n))
    delta = jax.tree.map(lambda a, b: jnp.asarray(a, jnp.float32) - b, new_params, params)
    u = jnp.sqrt(group_sq_norms(delta, n)) / jnp.maximum(jnp.sqrt(group_sq_norms(params, n)),
                                                         1e-30)
    return jnp.concatenate([p, g, u])

  def health(step, params, grads, new_params):
    return jax.lax.cond((step + 1) % every == 0, compute,
                        lambda *_: jnp.zeros(len(names), jnp.float32), params, grads,
                        new_params)

  return names, health


def _sown(tree, prefix: str = "") -> list[tuple[str, jax.Array]]:
  """(name, max over the leaf's non-layer axes) for each sown value; a stacked leaf of shape
  (L, ...) (sown inside the scanned stack) gives one entry per layer."""
  out = []
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out += _sown(value, name + "/")
      continue
    for leaf in jax.tree.leaves(value):  # flax sows a tuple of values
      if leaf.ndim >= 1:
        flat = leaf.reshape(leaf.shape[0], -1).max(axis=1)
        out += [(f"{name}/{i}", flat[i]) for i in range(leaf.shape[0])]
      else:
        out.append((name, leaf))
  return out


def dead_fraction(h: jax.Array, axis_name: str | None = None) -> jax.Array:
  """Fraction of units (last axis) with h <= 0, i.e. relu(h) = 0, at every other index (and on
  every device's rows of the batch under `axis_name`)."""
  dead_C = jnp.all(h.reshape(-1, h.shape[-1]) <= 0, axis=0).astype(jnp.float32)
  if axis_name is not None:
    dead_C = jax.lax.pmin(dead_C, axis_name)
  return jnp.mean(dead_C)


def make_probe(model, task, axis_name: str | None = None) -> Callable:
  """`probe(state, batch) -> {name: scalar}`: one eval-mode forward with 'watch' mutable.

  Every signal is over the whole batch: under pmap (`axis_name`) each device sees B / D rows,
  so the maxima are `pmax`ed, the logits' std comes from pmeans of E z, then of E (z - mean)^2
  (equal shares), and a unit is dead only where it is dead on every device."""

  def pmax(x):
    return x if axis_name is None else jax.lax.pmax(x, axis_name)

  def pmean(x):
    return x if axis_name is None else jax.lax.pmean(x, axis_name)

  def forward(variables, x):
    return model.apply(variables, x, train=False, mutable=[COLLECTION])

  def probe(state, batch):
    variables = {"params": state.params, **state.model_state}
    (logits, sown), relus = xla_cpu.with_relu_inputs(forward, variables,
                                                     task.init_input(batch),
                                                     top=type(model).__name__)
    logits = jnp.asarray(logits, jnp.float32)
    mean = pmean(jnp.mean(logits))  # two passes: E z^2 - (E z)^2 cancels when |E z| >> std
    out = {"logit_max": pmax(jnp.max(logits)),
           "logit_std": jnp.sqrt(pmean(jnp.mean((logits - mean) ** 2)))}
    out.update({f"dead_relu/{layer}": dead_fraction(h, axis_name) for layer, h in relus})
    for name, value in _sown(sown.get(COLLECTION, {})):
      # 'h/attn/attn_max_logit/3' (scanned) or 'h_3/attn/attn_max_logit' -> 'h/3', 'h_3'
      layer = name.replace("/attn/attn_max_logit", "").replace("attn_max_logit", "attn")
      out[f"attn_max_logit/{layer}"] = pmax(value)
    return out

  return probe


class Watcher:
  """The loop's side: which steps are watched, the probe, and the records they make."""

  def __init__(self, r, abstract_state):
    self.mode, self.every = r.train.watch, r.train.watch_every
    self.names: list[str] = []
    self.health = None
    self.probe = self.probe_fn = None
    self.pending: dict[int, dict] = {}
    if self.mode == "off":
      return
    self.names, self.health = make_health(abstract_state.params, r.model, self.every)
    if self.mode == "detailed":
      if r.task.kind.family in PROBED:
        self.probe = make_probe(r.model, r.task, r.strategy.axis_name)
      else:
        log.info("train.watch='detailed': no logit probe for task %r; cheap signals only",
                 r.task.kind.name)

  def compile(self, strategy, state) -> None:
    if self.probe is not None:
      self.probe_fn = strategy.compile_eval(self.probe, state)

  def watched(self, step: int) -> bool:
    return self.health is not None and step % self.every == 0

  def after_dispatch(self, step: int, state, batch) -> None:
    """Dispatches the probe on a watched step's updated state (read back with its metrics)."""
    if self.probe_fn is not None and self.watched(step):
      self.pending[step] = self.probe_fn(state, batch)

  def take(self, step: int, host_metrics: dict, first: Callable) -> dict | None:
    """Pops the health vector from a step's host metrics; the watch record of a watched step."""
    vector = host_metrics.pop("watch", None)
    probed = self.pending.pop(step, None)
    if vector is None or not self.watched(step):
      return None
    record = dict(zip(self.names, np.asarray(vector, np.float64).tolist()))
    if probed is not None:
      probed = jax.device_get(first(probed))
      record.update({k: float(v) for k, v in probed.items()})
    return record
