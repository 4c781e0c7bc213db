"""Signal propagation, attention scores, dropout and the first loss, measured on jaxdl's layers.

Shapes: B batch (samples), N width, L depth (layers), R random networks, K classes.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdl.models import build_model, layers


# ------------------------------------------------------------------------- signal propagation


def product_gradient(gain: float, depth: int = 20) -> float:
  """d h_L / d h_0 for h_l = gain * h_{l-1}, L = depth scalar layers, computed with jax.grad."""
  gains_L = jnp.full((depth,), gain, jnp.float32)

  def forward(h0):
    return jax.lax.fori_loop(0, depth, lambda i, h: gains_L[i] * h, h0)

  return float(jax.grad(forward)(jnp.float32(1.0)))


def _net_keys(seed: int, nets: int):
  return jax.random.split(jax.random.PRNGKey(seed), nets)


def relu_stack_moments(init: str, *, depth: int = 12, width: int = 512, batch: int = 128,
                       nets: int = 30, seed: int = 0, backward: bool = True) -> dict:
  """Second moments per layer of deep ReLU stacks, averaged over `nets` random networks.

  The input x_BxN is one standard-normal draw shared by all networks (as in the lesson); each
  network draws its L kernels NxN from `layers.get_initializer(init)` (no biases).

  Returns {'forward': (L + 1,) E[h_l^2] for l = 0..L (l = 0 is the input), 'backward':
  (L + 1,) E[(d(g . h_L)/d h_l)^2] with g ~ N(0, 1) (l = L is g itself), 'per_net': (R,) the
  final forward second moment of each network}.
  """
  kinit = layers.get_initializer(init)
  k_x, k_g = jax.random.split(jax.random.PRNGKey(10_000 + seed))
  x_BxN = jax.random.normal(k_x, (batch, width))
  g_BxN = jax.random.normal(k_g, (batch, width))

  @jax.jit
  def one_net(key):
    def run(e_L1xBxN):
      # h_l = relu(W_l h_{l-1}) + e_l with e = 0: the gradient with respect to e_l is the
      # gradient with respect to h_l, for every l (and h_0 = x + e_0) in one backward pass.
      def layer(h, i):
        w_NxN = kinit(jax.random.fold_in(key, i), (width, width), jnp.float32)
        h = jax.nn.relu(h @ w_NxN) + e_L1xBxN[i + 1]
        return h, jnp.mean(h * h)
      h0 = x_BxN + e_L1xBxN[0]
      h_L, m_L = jax.lax.scan(layer, h0, jnp.arange(depth))
      return jnp.sum(g_BxN * h_L), jnp.concatenate([jnp.mean(h0 * h0)[None], m_L])

    zeros = jnp.zeros((depth + 1, batch, width))
    if not backward:
      return run(zeros)[1], jnp.zeros((depth + 1,))
    d_L1xBxN, m_L1 = jax.grad(run, has_aux=True)(zeros)
    return m_L1, jnp.mean(d_L1xBxN * d_L1xBxN, axis=(1, 2))

  fwd, bwd = [], []
  for key in _net_keys(seed, nets):
    f, b = one_net(key)
    fwd.append(np.asarray(f))
    bwd.append(np.asarray(b))
  fwd, bwd = np.stack(fwd), np.stack(bwd)
  out = {"forward": fwd.mean(0), "per_net": fwd[:, -1]}
  if backward:
    out["backward"] = bwd.mean(0)
  return out


def relu_stack_theory(init_variance_times_n: float, depth: int) -> np.ndarray:
  """E[h_l^2] / E[h_0^2] = (n Var(W) / 2)^l for l = 0..L (ReLU halves the second moment)."""
  return (init_variance_times_n / 2.0) ** np.arange(depth + 1)


def stack_rms(gain: float, *, residual: bool, depth: int = 12, width: int = 128,
              batch: int = 64, nets: int = 30, seed: int = 0) -> np.ndarray:
  """RMS(h_l) / RMS(h_0) for l = 0..L, second moments averaged over `nets` random networks.

  Branch F(h) = gain * W h with W NxN from the 'lecun_normal' initializer (Var 1/n, no
  nonlinearity, so the theory is exact in expectation): plain h_l = F(h_{l-1}),
  residual h_l = h_{l-1} + F(h_{l-1}).
  """
  x_BxN = jax.random.normal(jax.random.PRNGKey(20_000 + seed), (batch, width))
  m_RxL1 = _stack_moments(x_BxN, _net_keys(seed, nets), jnp.float32(gain), residual, depth)
  m = np.asarray(m_RxL1, np.float64).mean(0)
  return np.sqrt(m / m[0])


@functools.partial(jax.jit, static_argnums=(3, 4))
def _stack_moments(x_BxN, keys_R, gain, residual: bool, depth: int):
  kinit = layers.get_initializer("lecun_normal")
  width = x_BxN.shape[-1]

  def one_net(key):
    def layer(h, i):
      f = gain * (h @ kinit(jax.random.fold_in(key, i), (width, width), jnp.float32))
      h = h + f if residual else f
      return h, jnp.mean(h * h)
    _, m_L = jax.lax.scan(layer, x_BxN, jnp.arange(depth))
    return jnp.concatenate([jnp.mean(x_BxN * x_BxN)[None], m_L])

  return jax.vmap(one_net)(keys_R)


def stack_rms_theory(gain: float, *, residual: bool, depth: int = 12) -> np.ndarray:
  """(1 + a^2)^(l/2) for the residual stack, a^l for the plain one, l = 0..L."""
  depth_L1 = np.arange(depth + 1)
  return (1.0 + gain**2) ** (depth_L1 / 2.0) if residual else float(gain) ** depth_L1


# ------------------------------------------------------------------------- attention and dropout


def qk_score_std(d_k: int = 128, num: int = 100_000, seed: int = 0) -> tuple[float, float]:
  """(std of q . k, std of q . k / sqrt(d_k)) over `num` pairs of unit-variance vectors.

  The scale is the one `attention.attention_reference` applies, 1 / sqrt(q.shape[-1]).
  """
  kq, kk = jax.random.split(jax.random.PRNGKey(seed))
  q = jax.random.normal(kq, (num, d_k))
  k = jax.random.normal(kk, (num, d_k))
  raw = jnp.einsum("nk,nk->n", q, k)
  return float(jnp.std(raw)), float(jnp.std(raw / math.sqrt(q.shape[-1])))


def dropout_draws(p: float = 0.2, value: float = 3.0, num: int = 100_000, seed: int = 0,
                  train: bool = True) -> np.ndarray:
  """`num` activations equal to `value` after `jaxdl.models.mlp.MLP`'s dropout of rate p.

  The MLP has one hidden layer of width 1000 with the identity activation: its kernel is 0 and
  its bias `value`, so every hidden unit is `value` before dropout; the head is the identity
  matrix, so the output is exactly the dropped-out hidden layer.
  """
  width = 1000
  batch = -(-num // width)
  model = build_model(ml_collections.ConfigDict(dict(
      name="mlp", hidden=(width,), out=width, activation="identity", dropout=p)))
  x = jnp.zeros((batch, 1))
  params = model.init(jax.random.PRNGKey(seed), x, train=False)["params"]
  params = {"dense_0": {"kernel": jnp.zeros_like(params["dense_0"]["kernel"]),
                        "bias": jnp.full((width,), value, jnp.float32)},
            "head": {"kernel": jnp.eye(width, dtype=jnp.float32),
                     "bias": jnp.zeros((width,), jnp.float32)}}
  y = model.apply({"params": params}, x, train=train,
                  rngs={"dropout": jax.random.PRNGKey(seed + 1)})
  return np.asarray(y).reshape(-1)[:num]


# ------------------------------------------------------------------------- first loss


def first_loss(num_classes: int, head_scale: float = 0.01, *, batch: int = 512,
               features: int = 32, hidden=(128, 128), seed: int = 0) -> float:
  """Cross-entropy at step 0 of a fresh `mlp` classifier ('he' init), head kernel x head_scale.

  Inputs are standard normal, labels uniform over K classes; the loss is the 'classification'
  task's loss (no label smoothing). A small head gives logits near 0, so the loss is near ln K.
  """
  fn = _first_loss_fn(num_classes, batch, features, tuple(hidden))
  return float(fn(jax.random.PRNGKey(seed), jnp.float32(head_scale)))


@functools.lru_cache(maxsize=None)
def _first_loss_fn(num_classes: int, batch: int, features: int, hidden: tuple):
  """One compiled init + loss per shape (the head scale and the key are traced)."""
  from jaxdl.train.tasks import make_task
  model = build_model(ml_collections.ConfigDict(dict(
      name="mlp", hidden=hidden, out=num_classes, init_name="he")))
  task = make_task(ml_collections.ConfigDict(dict(task="classification",
                                                  train=dict(label_smoothing=0.0))))

  @jax.jit
  def fn(key, head_scale):
    kx, ky, kp = jax.random.split(key, 3)
    batch_ = {"x": jax.random.normal(kx, (batch, features)),
              "y": jax.random.randint(ky, (batch,), 0, num_classes)}
    params = model.init(kp, batch_["x"], train=False)["params"]
    head = dict(params["head"], kernel=params["head"]["kernel"] * head_scale)
    return task.loss_fn(model.apply, dict(params, head=head), {}, batch_, {}, False)[0]

  return fn
