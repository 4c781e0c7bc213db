"""Update rules by name, as optax transformations (learning rate included, clipping not).

g gradient, eta = schedule(t) learning rate, lambda weight decay, elementwise ops:

- sgd:       theta -= eta g
- momentum:  v = mu v + g; theta -= eta v                       (heavy ball, optax.sgd momentum)
- nesterov:  v = mu v + g; theta -= eta (g + mu v)              (optax's form; equals
             v = mu v + g(theta - eta mu v); theta -= eta v read at the look-ahead point)
- adagrad:   G += g^2; theta -= eta g / (sqrt(G) + eps)         (hand-written: optax's adagrad
             puts eps inside the sqrt and starts G at 0.1)
- rmsprop:   s = rho s + (1 - rho) g^2; theta -= eta g / (sqrt(s) + eps)
- adam:      m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
             theta -= eta m_hat / (sqrt(v_hat) + eps), m_hat = m / (1-b1^t), v_hat = v / (1-b2^t)
- adam_l2:   adam on g + lambda theta (coupled L2: the decay passes through the moments)
- adamw:     theta -= eta (m_hat / (sqrt(v_hat) + eps) + lambda theta) (decoupled decay)
- muon:      optax.contrib.muon: Newton-Schulz-orthogonalized Nesterov momentum (beta =
             muon_beta) on weight matrices (kernels with ndim >= 2; embeddings stay with Adam),
             and optax's Nesterov AdamW (b1, b2, eps) on the rest; then the decoupled decay
             theta -= eta lambda theta on the masked parameters.

Weight decay for sgd/momentum/nesterov/adagrad/rmsprop is the classic coupled L2 term
(lambda theta added to g before the rule); for adamw and muon it is decoupled. In every case it
touches only the parameters selected by `jaxdl.optim.masks.decay_mask`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, muon as optax_muon

from jaxdl.optim.masks import path_str


class AdagradState(NamedTuple):
  sum_of_squares: optax.Updates


def scale_by_adagrad(eps: float = 1e-8) -> optax.GradientTransformation:
  """g / (sqrt(G) + eps) with G = sum of g^2 since the start (G_0 = 0)."""

  def init_fn(params):
    return AdagradState(jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    ss = jax.tree.map(lambda s, g: s + jnp.square(g), state.sum_of_squares, updates)
    updates = jax.tree.map(lambda g, s: g / (jnp.sqrt(s) + eps), updates, ss)
    return updates, AdagradState(ss)

  return optax.GradientTransformation(init_fn, update_fn)


class DecoupledDecayState(NamedTuple):
  count: jax.Array


def decoupled_weight_decay(weight_decay: float, schedule: optax.Schedule,
                           mask_fn: Callable) -> optax.GradientTransformation:
  """Adds -eta_t lambda theta to the (already lr-scaled) updates of the masked parameters.

  Placed after a rule that already applied its learning rate (muon), so the decay is
  decoupled from the adaptive step and still follows the schedule.
  """

  def init_fn(params):
    del params
    return DecoupledDecayState(jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("decoupled_weight_decay needs params in update()")
    lr = schedule(state.count)
    mask = mask_fn(params)
    updates = jax.tree.map(lambda u, p, m: u - lr * weight_decay * p if m else u,
                           updates, params, mask)
    return updates, DecoupledDecayState(optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def _muon_dims(optim_cfg) -> Callable:
  """Kernels with ndim >= 2 (not embeddings) go to Muon: last axis output, others reduction."""
  del optim_cfg

  def dims(params):
    def one(path, x):
      if path_str(path).rsplit("/", 1)[-1] == "kernel" and jnp.ndim(x) >= 2:
        return MuonDimensionNumbers(reduction_axis=tuple(range(x.ndim - 1)),
                                    output_axis=x.ndim - 1)
      return None

    return jax.tree_util.tree_map_with_path(one, params)

  return dims


def _l2(cfg, mask_fn):
  return [optax.add_decayed_weights(cfg.weight_decay, mask_fn)] if cfg.weight_decay else []


def build_rule(cfg, schedule: optax.Schedule, mask_fn: Callable) -> optax.GradientTransformation:
  """The transformation for `cfg.name` (names validated by the caller)."""
  name, wd = cfg.name, cfg.weight_decay
  if name == "sgd":
    return optax.chain(*_l2(cfg, mask_fn), optax.sgd(schedule))
  if name in ("momentum", "nesterov"):
    return optax.chain(*_l2(cfg, mask_fn),
                       optax.sgd(schedule, momentum=cfg.momentum, nesterov=name == "nesterov"))
  if name == "adagrad":
    return optax.chain(*_l2(cfg, mask_fn), scale_by_adagrad(cfg.eps),
                       optax.scale_by_learning_rate(schedule))
  if name == "rmsprop":
    return optax.chain(*_l2(cfg, mask_fn),
                       optax.scale_by_rms(decay=cfg.rho, eps=cfg.eps, eps_in_sqrt=False),
                       optax.scale_by_learning_rate(schedule))
  if name == "adam":
    return optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  if name == "adam_l2":
    return optax.chain(*_l2(cfg, mask_fn), optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
  if name == "adamw":
    return optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=wd,
                       mask=mask_fn)
  if name == "muon":
    parts = [optax_muon(schedule, beta=cfg.get("muon_beta", 0.95), eps=cfg.eps,
                        weight_decay=0.0, adam_b1=cfg.b1, adam_b2=cfg.b2, adam_weight_decay=0.0,
                        muon_weight_dimension_numbers=_muon_dims(cfg))]
    if wd:
      parts.append(decoupled_weight_decay(wd, schedule, mask_fn))
    return optax.chain(*parts)
  raise AssertionError(name)


RULES = ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam", "adam_l2", "adamw",
         "muon")

__all__ = ["RULES", "build_rule", "scale_by_adagrad", "decoupled_weight_decay"]
