"""Convolution sizes, GPT block sizes and gradients, and attention maps of a trained GPT.

Shapes: B batch, T time, L layers.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdl.models import attention, build_model, gpt_config


# ------------------------------------------------------------------------- convolutions


def conv_output_length(n: int, k: int, s: int, p: int) -> int:
  """Output length of a real `flax.linen.Conv` (kernel k, stride s, padding p) on n inputs."""
  conv = nn.Conv(1, (k,), strides=(s,), padding=[(p, p)])
  x = jnp.zeros((1, n, 1))
  shapes = jax.eval_shape(lambda: conv.apply(conv.init(jax.random.PRNGKey(0), x), x))
  return int(shapes.shape[1])


def measured_receptive_field(num_layers: int = 3, k: int = 3, size: int = 21) -> int:
  """Side of the input square that one central output of L stacked k x k stride-1 convs sees.

  Measured, not computed: the gradient of that output with respect to the input is nonzero
  exactly on its receptive field (positive kernels, identity activations).
  """
  convs = [nn.Conv(1, (k, k), padding="SAME", kernel_init=nn.initializers.ones)
           for _ in range(num_layers)]
  x = jnp.zeros((1, size, size, 1))
  params = [c.init(jax.random.PRNGKey(i), x) for i, c in enumerate(convs)]

  def center(x):
    for c, p in zip(convs, params):
      x = c.apply(p, x)
    return x[0, size // 2, size // 2, 0]

  seen = np.asarray(jax.grad(center)(x)[0, :, :, 0]) != 0
  rows, cols = np.nonzero(seen)
  return int(max(rows.max() - rows.min() + 1, cols.max() - cols.min() + 1))


# ------------------------------------------------------------------------- transformers


def gpt_param_shapes(preset: str, **overrides):
  """Abstract params (shapes only, nothing allocated) of the GPT `preset`."""
  model = build_model(gpt_config(preset, **overrides))
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32),
                                           train=False))["params"]


def block_kernel_params(preset: str = "gpt2-small") -> float:
  """Scalars in the weight matrices (kernels) of one block, divided by d^2 (biases and norms
  excluded): W_Q, W_K, W_V, W_O give 4 d^2 and the 4d-wide MLP 8 d^2."""
  shapes = gpt_param_shapes(preset, scan_layers=False)
  d = gpt_config(preset).d_model
  kernels = [x.size for x in jax.tree.leaves(shapes["h_0"]) if x.ndim == 2]
  return sum(kernels) / d**2


def block_grad_norms(ln: str, *, n_layer: int = 8, d_model: int = 64, n_head: int = 4,
                     vocab: int = 64, seq: int = 32, batch: int = 8, init: str = "gpt2",
                     seed: int = 0, seeds=None) -> np.ndarray:
  """||d loss / d params of block l|| for l = 1..L of a fresh GPT ('pre' or 'post' LN).

  Next-token loss on random tokens at init; the blocks are one scan (params 'h' with a leading
  L axis), so the norm of block l reduces every axis but the first.
  Post-LN puts a norm on the residual path, so the gradients of the early blocks are scaled by
  the later norms; pre-LN keeps an identity path from the loss to every block.

  Returns norm_L for `seed`; with `seeds` (a sequence of S ints, `seed` ignored) norm_SxL, one
  row per seed (its own tokens and init), computed as one compiled program vmapped over the
  seeds' keys (one compile for any S).
  """
  cfg = gpt_config("", n_layer=n_layer, d_model=d_model, n_head=n_head, vocab_size=vocab,
                   block_size=seq, ln=ln, scan_layers=True, init_name=init)
  model = build_model(cfg)

  def norms_L(key):
    kt, kp = jax.random.split(key)
    tokens = jax.random.randint(kt, (batch, seq + 1), 0, vocab)
    params = model.init(kp, tokens[:, :-1], train=False)["params"]

    def loss(p):
      logits = model.apply({"params": p}, tokens[:, :-1], train=False)
      logp = jax.nn.log_softmax(logits)
      return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

    g = jax.grad(loss)(params)
    sq_L = sum(jnp.sum(x * x, axis=tuple(range(1, x.ndim))) for x in jax.tree.leaves(g["h"]))
    return jnp.sqrt(sq_L)

  if seeds is None:
    return np.asarray(jax.jit(norms_L)(jax.random.PRNGKey(seed)))
  keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
  return np.asarray(jax.jit(jax.vmap(norms_L))(keys))

# ------------------------------------------------------------------------- attention maps


def attention_maps(model_cfg, params, tokens_BxT) -> list[np.ndarray]:
  """The attention weights (B, H, T, T) of every attention layer of a GPT, in call order.

  Builds the model of `model_cfg` with unrolled blocks (scanned params are unstacked with
  `stack.unstack_layers`) and runs it with each `MultiHeadAttention` call intercepted to
  ask for its weights (the reference path); the model's own code is unchanged.
  """
  from jaxdl.models import stack
  cfg = ml_collections.ConfigDict(model_cfg.to_dict() if hasattr(model_cfg, "to_dict")
                                  else dict(model_cfg))
  cfg.scan_layers = False
  model = build_model(cfg)
  if "h" in params:
    params = stack.unstack_layers(params, model.n_layer)

  @jax.jit  # one program, not one per operation
  def maps(params, tokens_BxT):
    found = []

    def grab(next_fun, args, kwargs, context):
      mha = isinstance(context.module, attention.MultiHeadAttention)
      if mha and context.method_name == "__call__":
        if not kwargs.get("return_weights") and kwargs.get("cache") is None:
          y, aux = next_fun(*args, **dict(kwargs, return_weights=True))
          found.append(aux["weights"])
          return y
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(grab):
      model.apply({"params": params}, tokens_BxT, train=False)
    return found

  return [np.asarray(w) for w in maps(params, jnp.asarray(tokens_BxT))]
