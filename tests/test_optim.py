"""jaxdl.optim: each rule against its update formula written out with numpy, masks, clipping,
and the parse of the `optim` section (keys a rule does not have are refused)."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.optim import (OPTIMIZERS, decay_mask, decay_table, default_optim_config,
                         find_ema, make_optimizer)

STEPS = 5
LR = 0.05


def _cfg(name, **kw):
  c = default_optim_config()
  c.name = name
  c.lr = LR
  c.clip_norm = None
  c.weight_decay = 0.0
  c.schedule.name = "constant"
  c.schedule.warmup_frac = 0.0
  for k, v in kw.items():
    c[k] = v
  return c


def _params():
  rng = np.random.default_rng(0)
  return {"dense": {"kernel": rng.normal(size=(3, 2)).astype(np.float32),
                    "bias": rng.normal(size=(2,)).astype(np.float32)},
          "norm": {"scale": rng.normal(size=(2,)).astype(np.float32)}}


def _grads(t):
  rng = np.random.default_rng(100 + t)
  return jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), _params())


def _run_optax(cfg, steps=STEPS):
  tx, _ = make_optimizer(cfg, 100)
  p = jax.tree.map(jnp.asarray, _params())
  st = tx.init(p)
  for t in range(steps):
    u, st = tx.update(jax.tree.map(jnp.asarray, _grads(t)), st, p)
    p = optax.apply_updates(p, u)
  return p


def _run_ref(step_fn, init_state, steps=STEPS):
  """Applies `step_fn(theta, g, state, t, decayed) -> (theta, state)` to every leaf in numpy."""
  out = {}
  for mod, leaves in _params().items():
    out[mod] = {}
    for name, theta in leaves.items():
      theta = theta.astype(np.float64)
      state = init_state(theta)
      for t in range(steps):
        g = _grads(t)[mod][name].astype(np.float64)
        theta, state = step_fn(theta, g, state, t + 1, name == "kernel")
      out[mod][name] = theta
  return out


def _assert_close(a, b, tol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), y, rtol=tol, atol=tol),
               a, b)


def test_sgd_formula():
  def step(th, g, s, t, dec):
    return th - LR * g, s
  _assert_close(_run_optax(_cfg("sgd")), _run_ref(step, lambda th: None))


def test_sgd_l2_only_on_kernels():
  lam = 0.3

  def step(th, g, s, t, dec):
    return th - LR * (g + (lam * th if dec else 0.0)), s
  _assert_close(_run_optax(_cfg("sgd", weight_decay=lam)), _run_ref(step, lambda th: None))


def test_heavy_ball_momentum_formula():
  mu = 0.9

  def step(th, g, v, t, dec):
    v = mu * v + g
    return th - LR * v, v
  _assert_close(_run_optax(_cfg("momentum", momentum=mu)), _run_ref(step, np.zeros_like))


def test_nesterov_equals_lookahead_form():
  """The issue's form v = mu v + grad(theta - eta mu v); theta -= eta v, on a quadratic, is the
  optax trajectory read at the look-ahead point phi = theta - eta mu v."""
  mu, a = 0.9, np.array([0.3, 2.0, 0.7])
  grad = lambda th: 2 * a * th
  theta, v = np.array([1.0, -2.0, 0.5]), np.zeros(3)
  tx, _ = make_optimizer(_cfg("nesterov", momentum=mu), 100)
  phi = jnp.asarray(theta, jnp.float32)
  st = tx.init(phi)
  for _ in range(8):
    v = mu * v + grad(theta - LR * mu * v)
    theta = theta - LR * v
    u, st = tx.update(jnp.asarray(grad(np.asarray(phi, np.float64)), jnp.float32), st, phi)
    phi = optax.apply_updates(phi, u)
    np.testing.assert_allclose(np.asarray(phi), theta - LR * mu * v, rtol=1e-5, atol=1e-6)


def test_adagrad_formula():
  eps = 1e-8

  def step(th, g, G, t, dec):
    G = G + g**2
    return th - LR * g / (np.sqrt(G) + eps), G
  _assert_close(_run_optax(_cfg("adagrad", eps=eps)), _run_ref(step, np.zeros_like))


def test_rmsprop_formula():
  rho, eps = 0.8, 1e-3  # a large eps so that its place (outside the sqrt) matters

  def step(th, g, s, t, dec):
    s = rho * s + (1 - rho) * g**2
    return th - LR * g / (np.sqrt(s) + eps), s
  _assert_close(_run_optax(_cfg("rmsprop", rho=rho, eps=eps)), _run_ref(step, np.zeros_like))


def _adam_step(b1, b2, eps, lam_l2=0.0, lam_w=0.0):
  def step(th, g, mv, t, dec):
    m, v = mv
    if dec:
      g = g + lam_l2 * th
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g**2
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    th = th - LR * (m_hat / (np.sqrt(v_hat) + eps) + (lam_w * th if dec else 0.0))
    return th, (m, v)
  return step


def _zeros2(th):
  return (np.zeros_like(th), np.zeros_like(th))


def test_adam_formula():
  b1, b2, eps = 0.8, 0.95, 1e-3
  _assert_close(_run_optax(_cfg("adam", b1=b1, b2=b2, eps=eps)),
                _run_ref(_adam_step(b1, b2, eps), _zeros2))


def test_adam_l2_formula_kernels_only():
  b1, b2, eps, lam = 0.9, 0.999, 1e-8, 0.5
  _assert_close(_run_optax(_cfg("adam_l2", b1=b1, b2=b2, eps=eps, weight_decay=lam)),
                _run_ref(_adam_step(b1, b2, eps, lam_l2=lam), _zeros2))


def test_adamw_formula_kernels_only():
  b1, b2, eps, lam = 0.9, 0.999, 1e-8, 0.5
  _assert_close(_run_optax(_cfg("adamw", b1=b1, b2=b2, eps=eps, weight_decay=lam)),
                _run_ref(_adam_step(b1, b2, eps, lam_w=lam), _zeros2))


def test_muon_orthogonalizes_kernels_and_adams_the_rest():
  """Kernel updates have all singular values near eta * shape factor (Newton-Schulz output is
  roughly orthogonal); biases and scales follow the Adam formula; decay stays on kernels."""
  p0 = {"dense": {"kernel": jnp.ones((8, 4)), "bias": jnp.ones((4,))}}
  rng = np.random.default_rng(1)
  g = {"dense": {"kernel": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32),
                 "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}}
  lam = 0.1
  tx, _ = make_optimizer(_cfg("muon", weight_decay=lam), 100)
  u, _ = tx.update(g, tx.init(p0), p0)
  # kernel: -eta * (O * sqrt(max(1, fan_out / fan_in)) + lam * theta), fan_out 4 < fan_in 8.
  ortho = -(np.asarray(u["dense"]["kernel"]) / LR) - lam * 1.0
  sv = np.linalg.svd(ortho, compute_uv=False)
  assert np.all(sv > 0.5) and np.all(sv < 1.3), sv
  # bias: optax's muon runs Nesterov AdamW on the rest; at t = 1, m = (1-b1) g, and the
  # Nesterov first moment is b1 m / (1 - b1^2) + (1 - b1) g / (1 - b1) = g (1 + b1 / (1 + b1)),
  # v_hat = g^2, so the step is eta (1 + b1 / (1 + b1)) g / (|g| + eps); no decay on biases.
  gb, b1 = np.asarray(g["dense"]["bias"]), 0.9
  np.testing.assert_allclose(np.asarray(u["dense"]["bias"]),
                             -LR * (1 + b1 / (1 + b1)) * gb / (np.abs(gb) + 1e-8), rtol=1e-5)


def test_global_norm_clipping():
  c = 0.5
  tx, _ = make_optimizer(_cfg("sgd", clip_norm=c), 10)
  p = jax.tree.map(jnp.asarray, _params())
  g = _grads(0)
  norm = np.sqrt(sum(np.sum(x.astype(np.float64)**2) for x in jax.tree.leaves(g)))
  assert norm > c
  u, _ = tx.update(jax.tree.map(jnp.asarray, g), tx.init(p), p)
  jax.tree.map(lambda uu, gg: np.testing.assert_allclose(uu, -LR * gg * min(1, c / norm),
                                                         rtol=1e-5), u, g)
  # Default config clips at 1.0.
  assert default_optim_config().clip_norm == 1.0


def test_mask_leaves_biases_and_norms_untouched():
  """Zero gradients: Adam's step is 0, so AdamW moves only decayed leaves, by (1 - eta lam)^k."""
  import flax.linen as nn

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.Embed(10, 4, name="embed")(x)
      x = nn.LayerNorm(name="ln")(x)
      return nn.Dense(3, name="out")(x)

  params = Net().init(jax.random.PRNGKey(0), jnp.zeros((2,), jnp.int32))["params"]
  lam, k = 0.1, 4
  for emb in (False, True):
    tx, _ = make_optimizer(_cfg("adamw", weight_decay=lam, decay_embeddings=emb), 10)
    p, st = params, tx.init(params)
    for _ in range(k):
      u, st = tx.update(jax.tree.map(jnp.zeros_like, p), st, p)
      p = optax.apply_updates(p, u)
    f = (1 - LR * lam)**k
    np.testing.assert_allclose(p["out"]["kernel"], params["out"]["kernel"] * f, rtol=1e-5)
    np.testing.assert_allclose(p["embed"]["embedding"],
                               params["embed"]["embedding"] * (f if emb else 1.0), rtol=1e-5)
    for leaf in (("out", "bias"), ("ln", "scale"), ("ln", "bias")):
      np.testing.assert_array_equal(p[leaf[0]][leaf[1]], params[leaf[0]][leaf[1]])
  table = decay_table(params, _cfg("adamw", weight_decay=lam))
  assert "out/kernel" in table and "ln/scale" in table
  row = lambda name: next(r for r in table.splitlines() if r.startswith(name + " "))
  assert row("out/kernel").endswith("yes") and row("ln/scale").endswith("no")
  assert row("embed/embedding").endswith("no")
  assert f"decayed {4 * 3:,} of" in table.splitlines()[-1]


def test_decay_mask_patterns_replace_default():
  params = _params()
  m = decay_mask(_cfg("adamw", decay_mask=["norm/", r"bias$"]))(params)
  assert m == {"dense": {"kernel": False, "bias": True}, "norm": {"scale": True}}
  with pytest.raises(ValueError, match=r"^optim\.decay_mask"):
    decay_mask(_cfg("adamw", decay_mask=["("]))(params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_rule_runs_under_jit_and_decreases_a_quadratic(name):
  cfg = _cfg(name, lr=0.02)
  tx, _ = make_optimizer(cfg, 50)
  p = {"w": {"kernel": jnp.ones((4, 3))}, "b": {"bias": jnp.ones((3,))}}
  loss = lambda q: sum(jnp.sum(x**2) for x in jax.tree.leaves(q))

  @jax.jit
  def step(p, st):
    u, st = tx.update(jax.grad(loss)(p), st, p)
    return optax.apply_updates(p, u), st

  st = tx.init(p)
  l0 = loss(p)
  for _ in range(20):
    p, st = step(p, st)
  assert jnp.isfinite(loss(p)) and loss(p) < l0


@pytest.mark.parametrize("key,value,pattern", [
    ("name", "adamx", r"^optim\.name: unknown optimizer 'adamx'; expected one of sgd, "),
    ("lr", -1.0, r"^optim\.lr: "),
    ("weight_decay", -0.1, r"^optim\.weight_decay: "),
    ("b2", 1.0, r"^optim\.b2: "),
    ("clip_norm", -1.0, r"^optim\.clip_norm: "),
    ("ema_decay", 1.0, r"^optim\.ema_decay: must be in \[0, 1\)"),
    ("lrr", 0.1, r"^optim\.lrr: unknown key; expected one of b1, b2, "),
])
def test_bad_config_names_the_key(key, value, pattern):
  cfg = _cfg("adamw")
  cfg[key] = value
  with pytest.raises(ValueError, match=pattern):
    make_optimizer(cfg, 10)


def test_default_config_builds_and_accepts_typed_overrides():
  c = default_optim_config()
  c.lock()
  c.decay_mask = ["kernel"]
  c.clip_norm = None
  c.schedule.warmup_steps = 3
  c.schedule.name = "wsd"
  tx, sched = make_optimizer(c, 20)
  assert float(sched(3)) == pytest.approx(c.lr)
  # a partial optim config takes the defaults for the missing keys
  import ml_collections
  tx, sched = make_optimizer(ml_collections.ConfigDict({"name": "adam", "lr": 0.1}), 100)
  # default warmup_cosine: 5% warmup from 0
  assert float(sched(0)) == 0.0 and float(sched(5)) == pytest.approx(0.1)


def test_parameter_ema_follows_its_formula_and_leaves_training_unchanged():
  """ema_0 = theta_0, ema_k = d ema_{k-1} + (1 - d) theta_k, on top of any rule; same iterates."""
  d = 0.9
  cfg = _cfg("adam", ema_decay=d)
  tx, _ = make_optimizer(cfg, 100)
  p = jax.tree.map(jnp.asarray, _params())
  st = tx.init(p)
  ema_ref = jax.tree.map(lambda x: np.asarray(x, np.float64), _params())
  for t in range(STEPS):
    u, st = tx.update(jax.tree.map(jnp.asarray, _grads(t)), st, p)
    p = optax.apply_updates(p, u)
    ema_ref = jax.tree.map(lambda e, x: d * e + (1 - d) * np.asarray(x, np.float64), ema_ref, p)
  _assert_close(p, jax.tree.map(np.asarray, _run_optax(_cfg("adam"))))  # training unchanged
  _assert_close(find_ema(st), ema_ref)
  assert find_ema(make_optimizer(_cfg("adam"), 9)[0].init(p)) is None
  # a state restored without a target: named tuples come back as dicts keyed by field name
  restored = [{"count": 1}, {"ema": jax.tree.map(np.asarray, find_ema(st))}]
  _assert_close(find_ema(restored), ema_ref)


def test_default_optim_config_takes_the_keys_that_differ():
  """`default_optim_config(name, schedule=..., **keys)` equals the defaults set key by key; each
  key lands in the section or its schedule, and an unknown one is refused by name."""
  c = default_optim_config("adam", lr=0.01, clip_norm=None, schedule="constant", warmup_frac=0.0)
  d = default_optim_config()
  d.name, d.lr, d.clip_norm = "adam", 0.01, None
  d.schedule.name, d.schedule.warmup_frac = "constant", 0.0
  assert c.to_dict() == d.to_dict()
  with pytest.raises(ValueError, match="^optim.warmup_fraction: unknown key"):
    default_optim_config(warmup_fraction=0.1)
