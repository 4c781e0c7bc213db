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
touches only the parameters selected by `jaxdl.optim.masks.decay_mask`. `adam` has no weight
decay: it refuses `optim.weight_decay` (other than 0) rather than ignore it.

Each rule is a frozen dataclass registered in `OPTIMIZERS` by `@register_optimizer(name)`: its
fields are its `optim.*` keys with their defaults (written only here), checked on construction,
and `build(schedule, mask_fn)` returns its optax transformation. Adding an optimizer is one such
class (fields, `build`) plus its test against the update formula.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, muon as optax_muon

from jaxdl.optim.masks import path_str
from jaxdl.schema import NONNEG, UNIT, Settings, registrar, setting


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


def _muon_dims(params):
  """Kernels with ndim >= 2 (not embeddings) go to Muon: last axis output, others reduction."""

  def one(path, x):
    if path_str(path).rsplit("/", 1)[-1] == "kernel" and jnp.ndim(x) >= 2:
      return MuonDimensionNumbers(reduction_axis=tuple(range(x.ndim - 1)),
                                  output_axis=x.ndim - 1)
    return None

  return jax.tree_util.tree_map_with_path(one, params)


OPTIMIZERS: dict[str, type] = {}
register_optimizer = registrar(OPTIMIZERS, "optimizer")


@dataclasses.dataclass(frozen=True)
class Optimizer(Settings):
  """An update rule; its fields are its `optim.*` keys (lr, clipping, mask and EMA are common
  to every rule and live in `jaxdl.optim.configs.OptimConfig`)."""

  prefix: ClassVar[str] = "optim."
  kind: ClassVar[str] = "optimizer"
  none_is_default: ClassVar[bool] = True
  # weight_decay=0 is what a rule without decay does, so configs may say "no decay" for any rule.
  off_values: ClassVar[dict] = {"weight_decay": 0.0}

  def build(self, schedule: optax.Schedule, mask_fn: Callable) -> optax.GradientTransformation:
    """The rule as an optax transformation, lr `schedule(t)`, decay on `mask_fn(params)`."""
    raise NotImplementedError


# Fields shared by several rules are declared once, in these bases.
@dataclasses.dataclass(frozen=True)
class _Decayed(Optimizer):
  weight_decay: float = setting(0.01, NONNEG)  # lambda

  def l2(self, mask_fn: Callable) -> list:
    """Coupled L2: g + lambda theta on the masked parameters (nothing when lambda = 0)."""
    return [optax.add_decayed_weights(self.weight_decay, mask_fn)] if self.weight_decay else []


@dataclasses.dataclass(frozen=True)
class _Eps(Optimizer):
  eps: float = setting(1e-8, NONNEG)


@dataclasses.dataclass(frozen=True)
class _Moments(_Eps):
  b1: float = setting(0.9, UNIT)
  b2: float = setting(0.999, UNIT)


@register_optimizer("sgd")
@dataclasses.dataclass(frozen=True)
class Sgd(_Decayed):

  def build(self, schedule, mask_fn):
    return optax.chain(*self.l2(mask_fn), optax.sgd(schedule))


@register_optimizer("momentum")
@dataclasses.dataclass(frozen=True)
class Momentum(_Decayed):
  momentum: float = setting(0.9, UNIT)  # mu
  nesterov: ClassVar[bool] = False

  def build(self, schedule, mask_fn):
    return optax.chain(*self.l2(mask_fn),
                       optax.sgd(schedule, momentum=self.momentum, nesterov=self.nesterov))


@register_optimizer("nesterov")
@dataclasses.dataclass(frozen=True)
class Nesterov(Momentum):
  nesterov: ClassVar[bool] = True


@register_optimizer("adagrad")
@dataclasses.dataclass(frozen=True)
class Adagrad(_Decayed, _Eps):

  def build(self, schedule, mask_fn):
    return optax.chain(*self.l2(mask_fn), scale_by_adagrad(self.eps),
                       optax.scale_by_learning_rate(schedule))


@register_optimizer("rmsprop")
@dataclasses.dataclass(frozen=True)
class RmsProp(_Decayed, _Eps):
  rho: float = setting(0.9, UNIT)

  def build(self, schedule, mask_fn):
    return optax.chain(*self.l2(mask_fn),
                       optax.scale_by_rms(decay=self.rho, eps=self.eps, eps_in_sqrt=False),
                       optax.scale_by_learning_rate(schedule))


@register_optimizer("adam")
@dataclasses.dataclass(frozen=True)
class Adam(_Moments):
  unset_hints: ClassVar[dict] = {"weight_decay": "use 'adamw' (decoupled) or 'adam_l2'"}

  def build(self, schedule, mask_fn):
    del mask_fn  # no decay, so nothing is masked
    return optax.adam(schedule, b1=self.b1, b2=self.b2, eps=self.eps)


@register_optimizer("adam_l2")
@dataclasses.dataclass(frozen=True)
class AdamL2(_Decayed, _Moments):

  def build(self, schedule, mask_fn):
    return optax.chain(*self.l2(mask_fn),
                       optax.adam(schedule, b1=self.b1, b2=self.b2, eps=self.eps))


@register_optimizer("adamw")
@dataclasses.dataclass(frozen=True)
class AdamW(_Decayed, _Moments):

  def build(self, schedule, mask_fn):
    return optax.adamw(schedule, b1=self.b1, b2=self.b2, eps=self.eps,
                       weight_decay=self.weight_decay, mask=mask_fn)


@register_optimizer("muon")
@dataclasses.dataclass(frozen=True)
class Muon(_Decayed, _Moments):
  muon_beta: float = setting(0.95, UNIT)

  def build(self, schedule, mask_fn):
    # optax's own decay would skip the schedule and the mask; ours is applied after the rule.
    parts = [optax_muon(schedule, beta=self.muon_beta, eps=self.eps, weight_decay=0.0,
                        adam_b1=self.b1, adam_b2=self.b2, adam_weight_decay=0.0,
                        muon_weight_dimension_numbers=_muon_dims)]
    if self.weight_decay:
      parts.append(decoupled_weight_decay(self.weight_decay, schedule, mask_fn))
    return optax.chain(*parts)


RULES = tuple(OPTIMIZERS)  # the names, in registration order (kept for older callers)

__all__ = ["OPTIMIZERS", "RULES", "Optimizer", "register_optimizer", "scale_by_adagrad",
           "decoupled_weight_decay"]
