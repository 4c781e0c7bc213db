"""GAN (Goodfellow et al., 2014): the 'gan' model and task, and a mode-coverage measure.

Generator G(z), z ~ N(0, I); discriminator logit D(x). With softplus(u) = log(1 + e^u),

  L_D = E_x softplus(-D(x)) + E_z softplus(D(G(z))) + (gamma / 2) E_x ||grad_x D(x)||^2,
  L_G = E_z softplus(-D(G(z)))       (the non-saturating generator loss),

the last term of L_D the R1 penalty on real data (Mescheder et al., 2018; gamma = `gen.r1`,
0 disables it). Both parameter sets live in one `params` tree {'generator', 'discriminator'} and
one train step updates both at once (simultaneous gradient descent) through the engine's single
objective

  L = L_D(theta_D, sg(theta_G)) + L_G(sg(theta_D), theta_G),      sg = stop_gradient,

whose gradient is (dL_G/dtheta_G, dL_D/dtheta_D): each player descends its own loss.

Two optax chains, one state (`two_player`): the run's `optim` section is built once per player,
with that player's own peak lr and Adam moments where `gen.{g,d}_{lr,b1,b2}` set them (each
player's clipping acts on its own gradient norm); the optimizer state holds both chains and an
update counter k. `gen.updates` picks how they move:
  'simultaneous'  every step updates both players from gradients at the same (theta_D, theta_G);
  'alternating'   step k updates only D when k is even and only G when k is odd: the inactive
                  player's update is zero and its chain's state (moments, schedule count) is
                  carried unchanged. So an odd step's G gradient is taken at the D that the
                  previous step updated (D step, then G step on the updated D).
Alternation by step parity, rather than two updates inside one step, keeps the engine's step as
it is (one gradient of one objective, one `tx.update`), so checkpoints, bit-exact resume
(k lives in the optimizer state), gradient accumulation and the parallel strategies apply
unchanged; the price is that each step computes both players' gradients and discards one, and
a player takes T / 2 updates in T steps (its schedule is built over ceil(T / 2) of them; the
logged `lr` is the discriminator's).

Sampling is one generator call. A GAN defines no density, so it has no likelihood.
`modes_covered` counts the modes of a mixture that hold at least a given share of the samples.

Shapes: B batch, D data dims, Z latent dims, M modes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.generative import samplers
from jaxdl.generative.settings import GANSettings
from jaxdl.models import build_model, layers, register_model
from jaxdl.optim import ema_params
from jaxdl.optim.precision import select_tree
from jaxdl.schema import POSITIVE, each, parse_section, setting
from jaxdl.train.tasks import Family, Task, register_task
from jaxdl.train.token_losses import masked_mean

_EVAL_KEY = 20260103


class _MLP(nn.Module):
  widths: Sequence[int]
  out: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, h):
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    for w in self.widths:
      h = nn.leaky_relu(dense(w)(h), 0.2)
    return dense(self.out)(h).astype(jnp.float32)


@register_model("gan")
class GAN(layers.Model):
  """MLP generator and discriminator; `__call__(x) -> D(x)` logits (B,), and `generate(z)`.

  Attributes:
    data_shape: shape of one example; D = its product.
    latent: Z, the generator's input dims.
    hidden: the widths of both MLPs.
  """
  data_shape: tuple[int, ...] = setting((2,), each(POSITIVE))
  latent: int = setting(16, POSITIVE)
  hidden: tuple[int, ...] = setting((128, 128), each(POSITIVE))
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    self.generator = _MLP(tuple(self.hidden), math.prod(self.data_shape), **kw)
    self.discriminator = _MLP(tuple(self.hidden), 1, **kw)

  def generate(self, z_BxZ):
    """G(z) in data_shape."""
    return self.generator(z_BxZ).reshape((z_BxZ.shape[0],) + tuple(self.data_shape))

  def discriminate(self, x):
    """D(x): one logit per example, (B,)."""
    return self.discriminator(x.reshape(x.shape[0], -1).astype(self.dtype))[:, 0]

  def __call__(self, x, *, train: bool):
    del train  # no dropout or batch statistics
    # Both players run here, so `init` creates both parameter trees.
    self.generate(jnp.zeros((x.shape[0], self.latent), jnp.float32))
    return self.discriminate(x)


PLAYERS = {"g": "generator", "d": "discriminator"}


def parse_gan(config) -> GANSettings:
  """`config.gen` as checked `GANSettings` (one-line errors naming the key)."""
  return parse_section(config.get("gen"), GANSettings)


def gan_losses(apply_fn, params, x, z_BxZ, r1: float, batch):
  """(L_D, L_G, metrics) at live params; `gan_objective` adds the stop-gradients."""
  variables = {"params": params}
  fake = apply_fn(variables, z_BxZ, method=GAN.generate)
  d_real_B = apply_fn(variables, x, method=GAN.discriminate)
  d_fake_B = apply_fn(variables, fake, method=GAN.discriminate)
  loss_d = masked_mean(jax.nn.softplus(-d_real_B) + jax.nn.softplus(d_fake_B), batch)
  loss_g = masked_mean(jax.nn.softplus(-d_fake_B), batch)
  metrics = {"loss_d": loss_d, "loss_g": loss_g, "d_real": masked_mean(d_real_B, batch),
             "d_fake": masked_mean(d_fake_B, batch)}
  if r1:
    grad_x = jax.grad(lambda xx: jnp.sum(apply_fn(variables, xx, method=GAN.discriminate)))(x)
    penalty = masked_mean(jnp.sum(grad_x.reshape(x.shape[0], -1) ** 2, axis=1), batch)
    loss_d = loss_d + 0.5 * r1 * penalty
    metrics["r1_penalty"] = penalty
  return loss_d, loss_g, metrics


def gan_objective(apply_fn, params, x, z_BxZ, r1: float, batch):
  """L = L_D(theta_D, sg(theta_G)) + L_G(sg(theta_D), theta_G) (module docstring)."""
  sg = jax.lax.stop_gradient
  frozen_g = {**params, "generator": sg(params["generator"])}
  frozen_d = {**params, "discriminator": sg(params["discriminator"])}
  loss_d, _, metrics = gan_losses(apply_fn, frozen_g, x, z_BxZ, r1, batch)
  _, loss_g, _ = gan_losses(apply_fn, frozen_d, x, z_BxZ, 0.0, batch)
  return loss_d + loss_g, metrics


class TwoPlayerState(NamedTuple):
  count: jax.Array   # k, the number of updates so far (its parity picks the player)
  generator: Any     # the generator chain's state
  discriminator: Any


def two_player(tx_g: optax.GradientTransformation, tx_d: optax.GradientTransformation, *,
               alternating: bool) -> optax.GradientTransformation:
  """One transformation over {'generator', 'discriminator'} params: tx_g on the first subtree,
  tx_d on the second; alternating: only D moves at even k, only G at odd k (module docstring)."""

  def init_fn(params):
    return TwoPlayerState(jnp.zeros([], jnp.int32), tx_g.init(params["generator"]),
                          tx_d.init(params["discriminator"]))

  def update_fn(grads, state, params=None):
    p_g, p_d = (None, None) if params is None else (params["generator"],
                                                     params["discriminator"])
    u_g, s_g = tx_g.update(grads["generator"], state.generator, p_g)
    u_d, s_d = tx_d.update(grads["discriminator"], state.discriminator, p_d)
    if alternating:
      d_turn = state.count % 2 == 0
      u_d = select_tree(d_turn, u_d, jax.tree.map(jnp.zeros_like, u_d))
      s_d = select_tree(d_turn, s_d, state.discriminator)
      u_g = select_tree(d_turn, jax.tree.map(jnp.zeros_like, u_g), u_g)
      s_g = select_tree(d_turn, state.generator, s_g)
    updates = {**grads, "generator": u_g, "discriminator": u_d}
    return updates, TwoPlayerState(optax.safe_int32_increment(state.count), s_g, s_d)

  return optax.GradientTransformation(init_fn, update_fn)


def player_optimizers(settings: GANSettings):
  """`build(optim, total_steps) -> (tx, schedule)` for the engine (`Task.optimizer`): the run's
  parsed `optim` once per player with its overrides, joined by `two_player`; the EMA of the
  parameters (optim.ema_decay) follows, over both players."""

  def build(optim, total_steps: int):
    alternating = settings.updates == "alternating"
    player_steps = (total_steps + 1) // 2 if alternating else total_steps
    chains, schedules = {}, {}
    for p, player in PLAYERS.items():
      lr = getattr(settings, f"{p}_lr")
      moments = {k: getattr(settings, f"{p}_{k}") for k in ("b1", "b2")
                 if getattr(settings, f"{p}_{k}") is not None}
      if moments and not hasattr(optim.optimizer, "b1"):
        raise ValueError(f"gen.{p}_{next(iter(moments))}: optimizer {optim.name!r} has no Adam "
                         f"moments; use an Adam-family optim.name or leave it unset")
      mine = dataclasses.replace(optim, lr=optim.lr if lr is None else lr, ema_decay=None,
                                 optimizer=dataclasses.replace(optim.optimizer, **moments))
      chains[player], schedules[player] = mine.build(player_steps)
    tx = two_player(chains["generator"], chains["discriminator"], alternating=alternating)
    if optim.ema_decay is not None:
      tx = optax.chain(tx, ema_params(optim.ema_decay))
    lr_d = schedules["discriminator"]
    return tx, (lambda step: lr_d(step // 2)) if alternating else lr_d

  return build


@register_task("gan", Family.GENERATIVE)
def gan(config, train_settings) -> Task:
  """Non-saturating GAN updates through one objective and two chains (module docstring)."""
  del train_settings
  settings = parse_gan(config)
  latent = build_model(config.model).latent

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    del train
    x = batch["x"].astype(jnp.float32)
    key = rngs["noise"] if rngs else jax.random.PRNGKey(_EVAL_KEY)
    z_BxZ = jax.random.normal(key, (x.shape[0], latent), jnp.float32)
    loss, metrics = gan_objective(apply_fn, params, x, z_BxZ, settings.r1, batch)
    return loss, (metrics, model_state)

  return Task(loss_fn, optimizer=player_optimizers(settings))


def make_run_sampler(config, model):
  """`sample(variables, rng, num) -> x_num...`: z ~ N(0, I), one generator call."""
  del config  # the generator alone decides
  return samplers.latent_sampler(model, GAN.generate)


def modes_covered(x_Nx2, centres_Mx2, radius: float, min_share: float = 0.25) -> dict:
  """Modes hit: a sample within `radius` of its nearest centre counts for that mode; a mode is
  covered when it holds >= min_share of its fair share N / M. Returns the number covered, the
  per-mode counts and the fraction of samples within `radius` of any centre."""
  x = np.asarray(x_Nx2, np.float64).reshape(len(x_Nx2), -1)
  c = np.asarray(centres_Mx2, np.float64)
  d_NxM = np.linalg.norm(x[:, None, :] - c[None], axis=-1)
  near_N = d_NxM.min(1) <= radius
  counts_M = np.bincount(d_NxM.argmin(1)[near_N], minlength=len(c))
  fair = len(x) / len(c)
  return {"covered": int(np.sum(counts_M >= min_share * fair)), "counts": counts_M.tolist(),
          "near_fraction": float(near_N.mean())}
