"""Measurements behind the course's worked numbers, built on jaxdl's layers and models.

`jaxdl reproduce` and the notebooks call these; each returns plain numbers (numpy), never a
plot. Shapes: B batch (samples), N width, L depth (layers), R random networks, K classes.

Signal propagation (section 2 of the lesson):
  product_gradient       h_l = a h_{l-1} for L scalar layers: d h_L / d h_0 = a^L (by jax.grad)
  relu_stack_moments     E[h_l^2] per layer of a ReLU stack h_l = relu(W_l h_{l-1}) with W_l from
                         a `jaxdl.models.layers` initializer by name; forward activations and
                         backward gradients d(g . h_L)/d h_l for a unit-variance cotangent g.
                         Theory: E[h_l^2] = (n Var(W) / 2)^l E[h_0^2], so 2^-l for 1/n
                         ('lecun_normal') and 1 for 2/n ('he_normal').
  stack_rms              RMS of h_l / RMS of h_0 for the linear branch F(h) = a W h,
                         W ~ Var 1/n: plain h_l = F(h_{l-1}) -> a^l; residual
                         h_l = h_{l-1} + F(h_{l-1}) -> (1 + a^2)^(l/2) (the cross term has mean 0).
Normalization, attention, dropout, first loss, convolutions, GPT blocks:
  batchnorm_moons_curves the moons MLP's training loss per epoch with and without BatchNorm
  qk_score_std           std of q . k and of q . k / sqrt(d_k) for unit-variance q, k
  dropout_draws          the activations of `jaxdl.models.mlp.MLP`'s inverted dropout
  first_loss             cross-entropy of a fresh MLP classifier with its head scaled
  conv_output_length     the output length of a real `flax.linen.Conv`
  measured_receptive_field  input pixels reached by one output of stacked convs (by gradient)
  block_kernel_params    weights in the matrices of one GPT block, in units of d^2
  block_grad_norms       gradient norm of each GPT block's parameters at init (pre- vs post-LN)
Generative worked examples:
  two_point_field        the exact flow field for data +-1, as a denoiser `apply_fn`
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdl.models import build_model, gpt_config, layers

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
  l = np.arange(depth + 1)
  return (1.0 + gain**2) ** (l / 2.0) if residual else float(gain) ** l


# ------------------------------------------------------------------------- attention and dropout


def qk_score_std(d_k: int = 128, num: int = 100_000, seed: int = 0) -> tuple[float, float]:
  """(std of q . k, std of q . k / sqrt(d_k)) over `num` pairs of unit-variance vectors.

  The scale is the one `layers.attention_reference` applies, 1 / sqrt(q.shape[-1]).
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
      name="mlp", hidden=hidden, out=num_classes, init="he")))
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
                     seed: int = 0) -> np.ndarray:
  """||d loss / d params of block l|| for l = 1..L of a fresh GPT ('pre' or 'post' LN).

  Next-token loss on random tokens at init; the blocks are one scan (params 'h' with a leading
  L axis), so the norm of block l reduces every axis but the first.
  Post-LN puts a norm on the residual path, so the gradients of the early blocks are scaled by
  the later norms; pre-LN keeps an identity path from the loss to every block.
  """
  cfg = gpt_config("", n_layer=n_layer, d_model=d_model, n_head=n_head, vocab_size=vocab,
                   block_size=seq, ln=ln, scan_layers=True, init=init)
  model = build_model(cfg)
  kt, kp = jax.random.split(jax.random.PRNGKey(seed))
  tokens = jax.random.randint(kt, (batch, seq + 1), 0, vocab)
  params = jax.jit(lambda k: model.init(k, tokens[:, :-1], train=False))(kp)["params"]

  @jax.jit
  @jax.grad
  def grad(p):
    logits = model.apply({"params": p}, tokens[:, :-1], train=False)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  g = grad(params)
  sq_L = sum(jnp.sum(x * x, axis=tuple(range(1, x.ndim))) for x in jax.tree.leaves(g["h"]))
  return np.sqrt(np.asarray(sq_L))


# ------------------------------------------------------------------------- generative


def two_point_field(variables, x, t_B, y=None, train=False):
  """The exact flow field v*(x, t) for data +-1 as a denoiser `apply_fn` (`make_sampler`)."""
  del variables, y, train
  from jaxdl.generative import paths
  return paths.two_point_posterior_velocity(x, t_B.reshape(t_B.shape + (1,) * (x.ndim - 1)))


def decoupled_decay_factor(optim_cfg, steps: int) -> float:
  """The factor a weight with zero gradient keeps after `steps` updates of `optim_cfg`.

  With g = 0 an Adam-type step moves nothing, so only the decoupled decay acts:
  AdamW gives (1 - eta lambda)^steps.
  """
  import optax
  from jaxdl.optim import make_optimizer
  tx, _ = make_optimizer(optim_cfg, steps)
  w = {"w": jnp.ones((4,), jnp.float32)}

  def step(carry, _):
    p, st = carry
    u, st = tx.update(jax.tree.map(jnp.zeros_like, p), st, p)
    return (optax.apply_updates(p, u), st), None

  (w, _), _ = jax.lax.scan(step, (w, tx.init(w)), None, length=steps)
  return float(jnp.mean(w["w"]))


# ------------------------------------------------------------------------- normalization


def batchnorm_moons_curves(steps: int = 200) -> dict:
  """Per-step BCE training loss of experiments/moons_mlp.py without and with its 'bn' arg.

  Each run is `jaxdl.train.run` for `steps` full-batch epochs in a temporary workdir; returns
  {'plain': (steps_S, loss_S), 'bn': (steps_S, loss_S)} from the runs' metrics.jsonl. The loss of
  step s is the training-mode loss (BatchNorm on batch statistics) before update s.
  """
  import tempfile
  from jaxdl.config import load_config
  from jaxdl.train import run
  from jaxdl.train.writers import read_metrics
  out = {}
  for name, spec in (("plain", "moons_mlp"), ("bn", "moons_mlp:bn")):
    config, _ = load_config(spec, [f"train.steps={steps}", "train.plot=False", "train.log_every=1",
                                   f"train.ckpt_every={steps}", f"train.eval_every={steps}"])
    with tempfile.TemporaryDirectory() as workdir:
      run(config, workdir, progress=False)
      records = read_metrics(workdir, "train")
    out[name] = (np.array([r["step"] for r in records]), np.array([r["loss"] for r in records]))
  return out


# ------------------------------------------------------------------------- attention maps


def attention_maps(model_cfg, params, tokens_BxT) -> list[np.ndarray]:
  """The attention weights (B, H, T, T) of every attention layer of a GPT, in call order.

  Builds the model of `model_cfg` with unrolled blocks (scanned params are unstacked with
  `gpt.unstack_layers`) and runs it with each `MultiHeadAttention` call intercepted to ask for
  its weights (the reference path); the model's own code is unchanged.
  """
  from jaxdl.models import gpt
  cfg = ml_collections.ConfigDict(model_cfg.to_dict() if hasattr(model_cfg, "to_dict")
                                  else dict(model_cfg))
  cfg.scan_layers = False
  model = build_model(cfg)
  if "h" in params:
    params = gpt.unstack_layers(params, model.n_layer)
  found = []

  def grab(next_fun, args, kwargs, context):
    if isinstance(context.module, layers.MultiHeadAttention) and context.method_name == "__call__":
      if not kwargs.get("return_weights") and kwargs.get("cache") is None:
        y, aux = next_fun(*args, **dict(kwargs, return_weights=True))
        found.append(np.asarray(aux["weights"]))
        return y
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(grab):
    model.apply({"params": params}, jnp.asarray(tokens_BxT), train=False)
  return found


# ------------------------------------------------------------------------- debugging examples


def example_loss_curves(steps: int = 300, eval_every: int = 20, num_classes: int = 10,
                        seed: int = 0) -> dict:
  """Synthetic metrics histories, one per loss-curve symptom of the debugging table.

  Returns {case: {'train': records, 'eval': records, 'ln_k': ln K}} in the metrics.jsonl
  record format ({'step', 'loss'}), for `jaxdl.doctor.diagnose_history`. The healthy base is
  L(s) = 0.35 + (ln K - 0.35) exp(-s / 60) plus 2% noise; each case changes one thing:
    first_loss       the logits start huge (loss 46 at step 1), then it comes down
    nonfinite        the loss diverges from step 180 and is NaN from step 200
    flat             the loss stays near ln K
    spike            a few batches at step 170 give 8x the loss, then it recovers
    overfitting      eval loss turns up after step 100 while train keeps falling
    val_below_train  eval loss 25% below train (dropout acts only in training)
  """
  rng = np.random.default_rng(seed)
  s = np.arange(1, steps + 1)
  ln_k = math.log(num_classes)
  base = 0.35 + (ln_k - 0.35) * np.exp(-s / 60.0)
  noisy = lambda c: c * (1.0 + 0.02 * rng.standard_normal(c.shape))  # noqa: E731
  ev = s[eval_every - 1::eval_every]
  cases = {}

  def add(name, train, evals):
    cases[name] = {"train": [{"step": int(a), "loss": float(b)} for a, b in zip(s, train)],
                   "eval": [{"step": int(a), "loss": float(b)} for a, b in zip(ev, evals)],
                   "ln_k": ln_k}

  healthy_eval = base[ev - 1] * 1.05
  big = 0.35 + (46.0 - 0.35) * np.exp(-s / 15.0) + (ln_k - 0.35) * np.exp(-s / 60.0)
  add("first_loss", noisy(big), big[ev - 1] * 1.05)
  blow = noisy(base.copy())
  blow[s >= 180] = blow[s >= 180] * np.exp((s[s >= 180] - 180) / 4.0)
  blow[s >= 200] = np.nan
  add("nonfinite", blow, np.where(ev >= 200, np.nan, healthy_eval))
  flat = noisy(np.full(s.shape, ln_k * 0.995))
  add("flat", flat, np.full(ev.shape, ln_k))
  spike = noisy(base.copy())
  spike[(s >= 170) & (s < 174)] *= 8.0
  add("spike", spike, healthy_eval)
  train = noisy(0.05 + (ln_k - 0.05) * np.exp(-s / 50.0))
  over = 0.6 + (ln_k - 0.6) * np.exp(-ev / 40.0) + 0.004 * np.maximum(ev - 100, 0)
  add("overfitting", train, over)
  add("val_below_train", noisy(base), base[ev - 1] * 0.75)
  return cases
