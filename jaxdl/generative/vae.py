"""Variational autoencoder (Kingma & Welling, 2014): the 'vae' model and the 'vae' task.

Prior p(z) = N(0, I); encoder q(z|x) = N(mu(x), diag exp(logvar(x))); decoder p(x|z), either
  'gaussian'   N(x; m(z), diag sigma^2), sigma = exp(log_sigma) a learned vector: a density on the
               continuous data space, comparable with a flow's PF-ODE likelihood in the same space;
  'bernoulli'  prod_d Bern(x_d; sigmoid(l_d(z))): a likelihood only for binary x (on grey values
               in [0, 1] it is the usual cross-entropy surrogate, not a normalized density).
Reparameterization: z = mu + exp(logvar / 2) eps, eps ~ N(0, I) drawn from the step's 'noise'
stream, so the gradient flows through mu and logvar. The ELBO, in nats per example,

  ELBO(x) = E_q[log p(x|z)] - KL(q(z|x) || p(z)) <= log p(x),
  KL = 1/2 sum_j (mu_j^2 + exp(logvar_j) - 1 - logvar_j)                 (closed form),

with the gap log p(x) - ELBO = KL(q(z|x) || p(z|x)). Training minimizes (rec + beta KL) / D, per
data dimension, with rec = -log p(x|z) at one z per example; beta = `gen.beta` (beta-VAE,
Higgins et al., 2017). KL warmup (`gen.kl_warmup` = N > 0; Bowman et al., 2016): update u
weighs the KL by beta_u = beta min(1, u / N), so the decoder learns to use z before the KL
pulls q(z|x) to the prior; u counts updates in the model's 'progress' collection (model state:
checkpointed, so a resumed run continues the ramp), logged as `beta`. Evaluation reports the
beta = 1 bound: elbo (nats per example), bpd = -ELBO / (D ln 2), kl, rec, and active_units:
the latent dims whose posterior mean varies over the batch, Var_x(mu_j) > 0.01 (Burda et al.,
2016; posterior collapse leaves them at 0).
Sampling is one decoder call: x = m(z) (gaussian) or sigmoid(l(z)) (bernoulli), z ~ N(0, I).

Shapes: B batch, D data dims (flattened), Z latent dims, H hidden width.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.generative import samplers
from jaxdl.generative.settings import VAESettings
from jaxdl.models import build_model, layers, register_model
from jaxdl.schema import POSITIVE, ConfigError, each, one_of, parse_section, setting
from jaxdl.train.tasks import Family, Task, register_task
from jaxdl.train.token_losses import masked_mean

DECODERS = ("gaussian", "bernoulli")
_EVAL_KEY = 20260102
ACTIVE_VAR = 0.01  # Var_x(mu_j) above this counts latent dim j as active (Burda et al., 2016)


@register_model("vae")
class VAE(layers.Model):
  """MLP encoder and decoder; `__call__(x, eps) -> (log p(x|z)_B, mu_BxZ, logvar_BxZ)`.

  Attributes:
    data_shape: shape of one example, e.g. (8, 8, 1) or (2,); D = its product.
    latent: Z, the latent dims.
    hidden: encoder widths (the decoder mirrors them); () makes both maps affine.
    decoder: 'gaussian' or 'bernoulli' (module docstring).
    sigma_min: the gaussian sigma is max(exp(log_sigma), sigma_min): a pixel that is constant in
      the data (a digit's corners) would otherwise drive its sigma, and log p(x|z), to infinity.
  """
  data_shape: tuple[int, ...] = setting((8, 8, 1), each(POSITIVE))
  latent: int = setting(8, POSITIVE)
  hidden: tuple[int, ...] = setting((256, 256), each(POSITIVE))
  decoder: str = setting("gaussian", one_of(*DECODERS))
  # floor of the gaussian decoder's sigma (pixels that never vary)
  sigma_min: float = setting(1e-2, POSITIVE)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def setup(self):
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    dims = math.prod(self.data_shape)
    self.enc = [dense(w) for w in self.hidden]
    self.enc_out = dense(2 * self.latent)
    self.dec = [dense(w) for w in reversed(self.hidden)]
    self.dec_out = dense(dims)
    # The training updates so far, which the task counts for its KL warmup (module docstring);
    # variables without it (runs saved before it existed, bare params) still apply.
    if self.is_initializing() or self.has_variable("progress", "updates"):
      self.updates = self.variable("progress", "updates", lambda: jnp.zeros((), jnp.int32))
    if self.decoder == "gaussian":
      self.log_sigma = self.param("log_sigma", nn.initializers.zeros, (dims,), self.param_dtype)

  def encode(self, x):
    """(mu_BxZ, logvar_BxZ) of q(z|x)."""
    h = x.reshape(x.shape[0], -1).astype(self.dtype)
    for layer in self.enc:
      h = nn.silu(layer(h))
    mu_BxZ, logvar_BxZ = jnp.split(self.enc_out(h).astype(jnp.float32), 2, axis=-1)
    return mu_BxZ, logvar_BxZ

  def decode(self, z_BxZ):
    """The decoder's output: the mean m(z) (gaussian) or the logits l(z) (bernoulli), (B, D)."""
    h = z_BxZ.astype(self.dtype)
    for layer in self.dec:
      h = nn.silu(layer(h))
    return self.dec_out(h).astype(jnp.float32)

  def log_px(self, x_BxD, out_BxD):
    """log p(x|z) per example, summed over the D dims."""
    if self.decoder == "bernoulli":
      return jnp.sum(x_BxD * jax.nn.log_sigmoid(out_BxD)
                     + (1 - x_BxD) * jax.nn.log_sigmoid(-out_BxD), axis=1)
    log_sigma_D = jnp.maximum(self.log_sigma.astype(jnp.float32), math.log(self.sigma_min))
    z2_BxD = ((x_BxD - out_BxD) * jnp.exp(-log_sigma_D)) ** 2
    return -jnp.sum(0.5 * z2_BxD + log_sigma_D + 0.5 * math.log(2 * math.pi), axis=1)

  def mean(self, z_BxZ):
    """E[x | z] in data_shape: one decoder call (the sample `jaxdl sample` draws)."""
    out_BxD = self.decode(z_BxZ)
    if self.decoder == "bernoulli":
      out_BxD = jax.nn.sigmoid(out_BxD)
    return out_BxD.reshape((z_BxZ.shape[0],) + tuple(self.data_shape))

  def __call__(self, x, eps_BxZ=None, *, train: bool):
    """log p(x|z) at z = mu + exp(logvar / 2) eps (z = mu when eps is None), mu, logvar."""
    del train  # no dropout or batch statistics
    mu_BxZ, logvar_BxZ = self.encode(x)
    z_BxZ = mu_BxZ if eps_BxZ is None else mu_BxZ + jnp.exp(0.5 * logvar_BxZ) * eps_BxZ
    x_BxD = x.reshape(x.shape[0], -1).astype(jnp.float32)
    return self.log_px(x_BxD, self.decode(z_BxZ)), mu_BxZ, logvar_BxZ


def gaussian_kl(mu_BxZ, logvar_BxZ):
  """KL(N(mu, diag e^logvar) || N(0, I)) = 1/2 sum_j (mu^2 + e^logvar - 1 - logvar), per row."""
  return 0.5 * jnp.sum(mu_BxZ**2 + jnp.exp(logvar_BxZ) - 1.0 - logvar_BxZ, axis=1)


def active_units(mu_BxZ, mask_B=None):
  """The number of latent dims j with Var_x(mu_j(x)) > ACTIVE_VAR over the (real) batch rows."""
  w_B = jnp.ones(mu_BxZ.shape[:1]) if mask_B is None else mask_B.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(w_B), 1.0)
  mean_Z = jnp.sum(w_B[:, None] * mu_BxZ, axis=0) / n
  var_Z = jnp.sum(w_B[:, None] * (mu_BxZ - mean_Z) ** 2, axis=0) / n
  return jnp.sum(var_Z > ACTIVE_VAR).astype(jnp.float32)


# ----------------------------------------------------------------------------- the task


def parse_vae(config) -> VAESettings:
  """`config.gen` as checked `VAESettings`: an unknown key is one line naming it."""
  settings = parse_section(config.get("gen"), VAESettings)
  data_shape = tuple(build_model(config.model).data_shape)
  if data_shape != settings.sample_shape:
    raise ConfigError(f"gen.sample_shape={settings.sample_shape} but model.data_shape="
                     f"{data_shape}; they must agree")
  return settings


@register_task("vae", Family.GENERATIVE, likelihood="elbo")
def vae(config, train_settings) -> Task:
  """(rec + beta KL) / D with one reparameterized z per example (module docstring)."""
  settings = parse_vae(config)
  latent = build_model(config.model).latent
  # Under gradient accumulation the loss runs once per microbatch, so the counter moves N times
  # an update.
  accum = train_settings.grad_accum

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    x = batch["x"].astype(jnp.float32)
    key = rngs["noise"] if rngs else jax.random.PRNGKey(_EVAL_KEY)
    eps_BxZ = jax.random.normal(key, (x.shape[0], latent), jnp.float32)
    log_px_B, mu_BxZ, logvar_BxZ = apply_fn({"params": params, **model_state}, x, eps_BxZ,
                                            train=train)
    kl_B = gaussian_kl(mu_BxZ, logvar_BxZ)
    dims = math.prod(x.shape[1:])
    mask_B = batch.get("mask")
    beta = settings.beta
    if train and settings.kl_warmup and "progress" not in model_state:
      raise ValueError("gen.kl_warmup: the model state has no 'progress' counter to ramp beta "
                       "by (pass the state that model.init made)")
    if train and "progress" in model_state:
      calls = model_state["progress"]["updates"]
      if settings.kl_warmup:
        beta = beta * jnp.minimum(1.0, (calls // accum) / settings.kl_warmup)
      model_state = {**model_state, "progress": {"updates": calls + 1}}
    loss = masked_mean((-log_px_B + beta * kl_B) / dims, batch)
    elbo = masked_mean(log_px_B - kl_B, batch)
    metrics = {"elbo": elbo, "bpd": -elbo / (dims * math.log(2.0)),
               "kl": masked_mean(kl_B, batch), "rec": masked_mean(-log_px_B, batch),
               "active_units": active_units(mu_BxZ, mask_B), "beta": beta}
    return loss, (metrics, model_state)

  return Task(loss_fn)


def make_run_sampler(config, model):
  """`sample(variables, rng, num) -> x_num...`: z ~ N(0, I), then one decoder call (the mean)."""
  del config  # the decoder alone decides
  return samplers.latent_sampler(model, VAE.mean)


def run_elbo(model, variables, x, *, batch_size: int | None = None) -> dict:
  """The beta = 1 bound of a trained VAE on data x_N...: 'elbo' (nats per example, mean over x)
  and 'bpd' = -ELBO / (D ln 2).

  ELBO(x_n) = log p(x_n | z_n) - KL(q(z | x_n) || N(0, I)), z_n = mu(x_n) + sigma(x_n) eps_n, with
  one eps_n per example drawn for all of x first (the fixed evaluation key): an unbiased
  estimate of the bound whose value does not depend on `batch_size` (examples per call of one
  compiled program, the last batch padded; None: all at once) nor on the other examples.
  """
  x = jnp.asarray(x, jnp.float32)
  num = x.shape[0]
  eps_NxZ = jax.random.normal(jax.random.PRNGKey(_EVAL_KEY), (num, model.latent), jnp.float32)

  @jax.jit
  def bound(x_B, eps_BxZ):
    log_px_B, mu_BxZ, logvar_BxZ = model.apply(variables, x_B, eps_BxZ, train=False)
    return log_px_B - gaussian_kl(mu_BxZ, logvar_BxZ)

  rows = num if batch_size is None else min(batch_size, num)
  elbo_N = []
  for lo in range(0, num, rows):
    n = min(rows, num - lo)
    x_B, eps_BxZ = (jnp.pad(a[lo:lo + n], [(0, rows - n)] + [(0, 0)] * (a.ndim - 1), mode="edge")
                    for a in (x, eps_NxZ))
    elbo_N.append(np.asarray(bound(x_B, eps_BxZ))[:n])
  elbo = float(np.mean(np.concatenate(elbo_N), dtype=np.float64))
  return {"elbo": elbo, "bpd": -elbo / (math.prod(x.shape[1:]) * math.log(2.0))}
