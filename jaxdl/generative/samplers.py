"""Samplers for Gaussian paths, each a single `jax.lax.scan` over a precomputed time grid.

`make_sampler(...)` returns `sample(variables, rng, num, y=None) -> x_B...`: one jitted program,
no Python loop around the model. The grid runs from noise to data; step i goes from time t_i to
t_{i+1} = s, with (alpha, sigma) the path's coefficients. Every update works on the pair
(x_hat, eps_hat) that the network's output converts to (`paths.to_x_eps`):

  'ddim'   x_s = alpha_s x_hat + sqrt(sigma_s^2 - c^2) eps_hat + c z,
           c^2 = eta^2 sigma_s^2 (1 - SNR_t / SNR_s), SNR = alpha^2 / sigma^2   (Song et al., 2021)
           eta = 0 is deterministic; eta = 1 has the variance of the ancestral step. On the flow
           path DDIM with eta = 0 is exactly the Euler step.
  'ddpm'   ancestral: x_s ~ q(x_s | x_t, x = x_hat) = N(mean, var) with alpha_ts = alpha_t/alpha_s,
           sigma_ts^2 = sigma_t^2 - alpha_ts^2 sigma_s^2,
           mean = alpha_ts sigma_s^2/sigma_t^2 x_t + alpha_s sigma_ts^2/sigma_t^2 x_hat,
           var = sigma_ts^2 sigma_s^2 / sigma_t^2      (Ho et al., 2020, on any sub-sequence).
  'euler'  x_s = x_t + h v(x_t, t), h = s - t, v = alpha' x_hat + sigma' eps_hat
           (flow: x_hat - eps_hat).
  'heun'   x' = x_t + h v(x_t, t); x_s = x_t + h/2 (v(x_t, t) + v(x', s)).
Classifier-free guidance mixes the raw outputs, out~ = out(x) + w (out(x, c) - out(x)), with one
batched call of size 2B per evaluation (the null class marks "unconditional"); this is exact for
eps, x0, v and velocity outputs alike because the conversions are affine in the output.

  'edm_heun'  Karras et al.'s Heun sampler in sigma_ve = sigma / alpha with optional churn, last
           step Euler; 'dpmpp_2m', 'dpmpp_3m' DPM-Solver++ multistep (`jaxdl.generative.solvers`).
The grid is the path's own (`path.time_grid`) or one spaced evenly in t, the log-SNR or Karras's
sigma^(1/rho) (`spacing`, `jaxdl.generative.spacings`).

Each update is one entry of `SAMPLERS`, a pure `step(grid, variables, x, i, key, y_B) -> x_s`
registered with `@register_sampler(name, continuous_only=...)`; the `Grid` gives it the time grid,
(alpha, sigma), eta and the network as `grid.predict` (x_hat, eps_hat, out) and `grid.velocity`
(dx/dt). A new sampler is one such function: `make_sampler(..., sampler=name)` then finds it.
A multistep rule (`history` = k > 0) is `step(grid, variables, x, hist, i, key, y_B) -> (x_s,
hist)` with k earlier arrays in the scan's carry; a rule's `prepare` computes its per-step
constants on the host (`grid.coef`); `order` is the fewest steps it takes.

Shapes: B samples, N steps; x_B... is a batch of samples of `sample_shape`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.generative import paths as paths_lib
from jaxdl.generative import solvers, spacings


@dataclasses.dataclass(frozen=True)
class SamplerRule:
  """A registered update: `step(grid, variables, x, i, key, y_B) -> x_{i+1}` from t_i to t_{i+1}.

  continuous_only: the rule evaluates d x/dt (an ODE in continuous time), so it needs a path with
  `path.continuous` (the flow path); on a DDPM path `make_sampler` refuses it.
  order: the fewest steps the rule takes (a k-th order solver refuses N < k).
  history: k > 0 for a multistep rule, which carries k earlier arrays (see the module docstring).
  prepare: `prepare(path, t_N1, alpha_N1, sigma_N1, options) -> dict` of per-step constants
  (float64 numpy arrays, computed once; `grid.coef`), or None.
  """
  step: Callable
  continuous_only: bool = False
  order: int = 1
  history: int = 0
  prepare: Callable | None = None


# name -> SamplerRule, filled by @register_sampler below (and by any module that adds a sampler).
SAMPLERS: dict[str, SamplerRule] = {}


def register_sampler(name: str, *, continuous_only: bool = False, order: int = 1,
                     history: int = 0, prepare: Callable | None = None):
  """Decorator: registers `step(grid, variables, x, i, key, y_B) -> x_next` as sampler `name`
  (with `history` > 0: `step(grid, variables, x, hist, i, key, y_B) -> (x_next, hist)`)."""
  def register(step: Callable) -> Callable:
    if name in SAMPLERS:
      # A second registration would silently change what an existing config samples with.
      raise ValueError(f"sampler {name!r} is already registered: {sorted(SAMPLERS)}")
    SAMPLERS[name] = SamplerRule(step, continuous_only, order, history, prepare)
    return step
  return register


def ddim_update(x_hat, eps_hat, alpha_t, sigma_t, alpha_s, sigma_s, eta=0.0, z=None):
  """One DDIM step t -> s: x_s = alpha_s x_hat + sqrt(sigma_s^2 - c^2) eps_hat + c z.

  c^2 = eta^2 sigma_s^2 (1 - (alpha_t sigma_s)^2 / (alpha_s sigma_t)^2); with eta = 0 (z unused)
  the step keeps x_hat and eps_hat and mixes them again at the new noise level.
  """
  b = paths_lib._bc
  ratio = (alpha_t * sigma_s) / (alpha_s * sigma_t)
  c2 = eta**2 * sigma_s**2 * jnp.maximum(1.0 - ratio**2, 0.0)
  x_s = b(alpha_s, x_hat) * x_hat + b(jnp.sqrt(jnp.maximum(sigma_s**2 - c2, 0.0)), x_hat) * eps_hat
  if z is not None:
    x_s = x_s + b(jnp.sqrt(c2), x_hat) * z
  return x_s


def ancestral_mean_var(x_t, x_hat, alpha_t, sigma_t, alpha_s, sigma_s):
  """Mean and variance of the Gaussian posterior q(x_s | x_t, x = x_hat) for s < t in noise."""
  b = paths_lib._bc
  alpha_ts = alpha_t / alpha_s
  sigma_ts2 = sigma_t**2 - alpha_ts**2 * sigma_s**2
  mean = (b(alpha_ts * sigma_s**2 / sigma_t**2, x_t) * x_t
          + b(alpha_s * sigma_ts2 / sigma_t**2, x_t) * x_hat)
  return mean, sigma_ts2 * sigma_s**2 / sigma_t**2


def guided_output(apply_fn, variables, x_t, tm_1, y_B, guidance, null_class):
  """Network output at the shared model time tm_1 (shape (1,)), with classifier-free guidance
  when `guidance` is not None.

  out~ = out(x, null) + w (out(x, y) - out(x, null)); the two branches run as one 2B batch.
  """
  if guidance is None:
    return apply_fn(variables, x_t, tm_1, y=y_B, train=False)
  num = x_t.shape[0]
  y2_B = jnp.concatenate([y_B, jnp.full_like(y_B, null_class)])
  out = apply_fn(variables, jnp.concatenate([x_t, x_t]), tm_1, y=y2_B, train=False)
  cond, uncond = out[:num], out[num:]
  return uncond + guidance * (cond - uncond)


@dataclasses.dataclass(frozen=True)
class Grid:
  """What a sampler step sees: the grid t_0..t_N (noise -> data) and the network on it.

  t, alpha, sigma: shape (N + 1,) float32, the path time and coefficients at each grid point;
  eta: the DDIM noise scale. `predict` and `velocity` evaluate the (guided) network at grid
  point j; a step from t_i to s = t_{i+1} may call them at j = i and j = i + 1.
  """
  t: jax.Array
  tm: jax.Array  # the time the network is fed, path.model_time(t)
  alpha: jax.Array
  sigma: jax.Array
  eta: float
  d_alpha: Any  # d alpha/dt, d sigma/dt on a continuous path; None on a discrete one
  d_sigma: Any
  apply_fn: Callable
  prediction: str
  guidance: float | None
  null_class: int | None
  clip_x0: float | None  # in the path's units: clip_x0 / path.data_scale
  coef: Any = None  # the rule's per-step constants (`SamplerRule.prepare`), float32
  model_time: Callable | None = None  # path.model_time, for `predict_at`

  def predict(self, variables, x, j, y_B):
    """(x_hat, eps_hat, raw output) at grid point j."""
    return self._predict(variables, x, self.tm[j], self.alpha[j], self.sigma[j], y_B)

  def predict_at(self, variables, x, t, alpha, sigma, y_B):
    """(x_hat, eps_hat) at a time t between the grid's points, with its (alpha, sigma)."""
    return self._predict(variables, x, self.model_time(t), alpha, sigma, y_B)[:2]

  def _predict(self, variables, x, tm, a, s, y_B):
    # Every sample is at the same time: pass it once, shape (1,), so that a denoiser can embed it
    # once and broadcast (per-sample (B,) times are for training).
    out = guided_output(self.apply_fn, variables, x, tm[None], y_B, self.guidance,
                        self.null_class)
    x_hat, eps_hat = paths_lib.to_x_eps(out, x, a, s, self.prediction)
    if self.clip_x0 is not None:
      x_hat = jnp.clip(x_hat, -self.clip_x0, self.clip_x0)
      eps_hat = paths_lib.x0_to_eps(x, x_hat, a, s)
    return x_hat, eps_hat, out

  def velocity(self, variables, x, j, y_B):
    """dx/dt at grid point j: v = alpha' x_hat + sigma' eps_hat (continuous paths only)."""
    x_hat, eps_hat, out = self.predict(variables, x, j, y_B)
    if self.prediction == "velocity" and self.clip_x0 is None:
      return out  # the network output is already dx/dt; skip a round trip through (x_hat, eps_hat)
    d_alpha, d_sigma = (jnp.asarray(d)[j] if jnp.ndim(d) else d  # per grid point on EDM
                        for d in (self.d_alpha, self.d_sigma))
    return d_alpha * x_hat + d_sigma * eps_hat


# ----------------------------------------------------------------------------- the built-in rules
# Step i goes from t = t_i to s = t_{i+1}; each body is its equation in the module docstring.


@register_sampler("ddpm")
def ddpm(grid, variables, x, i, key, y_B):
  """Ancestral: x_s ~ q(x_s | x_t, x = x_hat) = N(mean, var)."""
  x_hat, _, _ = grid.predict(variables, x, i, y_B)
  mean, var = ancestral_mean_var(x, x_hat, grid.alpha[i], grid.sigma[i],
                                 grid.alpha[i + 1], grid.sigma[i + 1])
  z = jax.random.normal(key, x.shape, x.dtype)
  return mean + jnp.sqrt(jnp.maximum(var, 0.0)) * z


@register_sampler("ddim")
def ddim(grid, variables, x, i, key, y_B):
  """x_s = alpha_s x_hat + sqrt(sigma_s^2 - c^2) eps_hat + c z (z unused when eta = 0)."""
  x_hat, eps_hat, _ = grid.predict(variables, x, i, y_B)
  z = jax.random.normal(key, x.shape, x.dtype) if grid.eta > 0 else None
  return ddim_update(x_hat, eps_hat, grid.alpha[i], grid.sigma[i],
                     grid.alpha[i + 1], grid.sigma[i + 1], grid.eta, z)


@register_sampler("euler", continuous_only=True)
def euler(grid, variables, x, i, key, y_B):
  """x_s = x_t + h v(x_t, t), h = s - t."""
  h = grid.t[i + 1] - grid.t[i]
  return x + h * grid.velocity(variables, x, i, y_B)


@register_sampler("heun", continuous_only=True)
def heun(grid, variables, x, i, key, y_B):
  """x' = x_t + h v(x_t, t); x_s = x_t + h/2 (v(x_t, t) + v(x', s))."""
  h = grid.t[i + 1] - grid.t[i]
  v_t = grid.velocity(variables, x, i, y_B)
  x_e = x + h * v_t
  return x + 0.5 * h * (v_t + grid.velocity(variables, x_e, i + 1, y_B))


register_sampler("edm_heun", order=2, prepare=solvers.edm_heun_coefficients)(solvers.edm_heun)
register_sampler("dpmpp_2m", order=2, history=1,
                 prepare=solvers.multistep_coefficients(2))(solvers.dpmpp)
register_sampler("dpmpp_3m", order=3, history=2,
                 prepare=solvers.multistep_coefficients(3))(solvers.dpmpp)


def _check_churn(s_churn, s_tmin, s_tmax, s_noise):
  if not s_churn >= 0 or not s_tmin >= 0 or not s_noise >= 0:
    raise ValueError(f"s_churn={s_churn}, s_tmin={s_tmin}, s_noise={s_noise}: each must be >= 0")
  if s_tmax is not None and not s_tmax >= s_tmin:
    raise ValueError(f"s_tmax={s_tmax}: expected s_tmax >= s_tmin = {s_tmin} (None: no bound)")


def build_parts(apply_fn, path, *, sampler, steps, sample_shape, prediction, eta, guidance,
                num_classes, t_end, clip_x0, spacing=None, rho=7.0, s_churn=0.0, s_tmin=0.0,
                s_tmax=None, s_noise=1.0):
  """Validates `make_sampler`'s settings and returns (init_fn, step_fn, n_steps, rule): the scan
  here and the one-step-at-a-time forms of `jaxdl.generative.stepwise` build from it."""
  if sampler not in SAMPLERS:
    raise ValueError(f"sampler={sampler!r}: expected one of {sorted(SAMPLERS)}")
  if not isinstance(steps, (int, np.integer)) or steps < 1:
    raise ValueError(f"steps={steps!r}: the number of sampler steps must be an integer >= 1")
  rule = SAMPLERS[sampler]
  if rule.continuous_only and not path.continuous:
    discrete = sorted(n for n, r in SAMPLERS.items() if not r.continuous_only)
    raise ValueError(f"sampler={sampler!r} works in continuous time and needs the 'flow' path; "
                     f"for a {path.name!r} path use one of {discrete}")
  refused = getattr(path, "refuses", {}).get(sampler)
  if refused:
    raise ValueError(f"sampler={sampler!r} cannot run on the {path.name!r} path: {refused}")
  if steps < rule.order:
    raise ValueError(f"steps={steps}: sampler={sampler!r} is of order {rule.order} and takes "
                     f"steps >= {rule.order}")
  _check_churn(s_churn, s_tmin, s_tmax, s_noise)
  if s_churn and sampler != "edm_heun":
    raise ValueError(f"s_churn={s_churn}: churn is an option of 'edm_heun', not {sampler!r}")
  # The conversions to (x_hat, eps_hat) hold only on their paths: elsewhere they would return
  # a wrong x_hat silently, so a prediction that does not fit the path is refused here.
  paths_lib.check_prediction(prediction, path)
  if guidance is not None and not num_classes:
    raise ValueError(f"guidance={guidance}: classifier-free guidance needs a class-conditional "
                     "model (num_classes > 0 with a null class); this model is unconditional")
  if eta < 0:
    raise ValueError(f"eta={eta}: expected eta >= 0")

  t_N1 = spacings.time_grid(path, steps, spacing, rho=rho, t_end=t_end)
  alpha_N1, sigma_N1 = (np.asarray(a, np.float64) for a in path.alpha_sigma(t_N1))
  da, ds = path.d_alpha_sigma(t_N1) if path.continuous else (None, None)
  coef = None
  if rule.prepare is not None:
    options = dict(s_churn=s_churn, s_tmin=s_tmin, s_tmax=s_tmax, s_noise=s_noise)
    coef = {k: jnp.asarray(v, jnp.bool_ if v.dtype == bool else jnp.float32)
            if isinstance(v, np.ndarray) else v
            for k, v in rule.prepare(path, t_N1, alpha_N1, sigma_N1, options).items()}
  grid = Grid(
      t=jnp.asarray(t_N1, jnp.float32), tm=jnp.asarray(path.model_time(t_N1), jnp.float32),
      alpha=jnp.asarray(alpha_N1, jnp.float32), sigma=jnp.asarray(sigma_N1, jnp.float32),
      eta=eta, d_alpha=da, d_sigma=ds, apply_fn=apply_fn, prediction=prediction,
      guidance=guidance, null_class=num_classes if num_classes else None,
      clip_x0=None if clip_x0 is None else clip_x0 / path.data_scale, coef=coef,
      model_time=path.model_time)

  def step_fn(variables, carry, i, key, y_B):
    """One update on the scan's carry (x, hist); hist is () for a one-step rule."""
    x, hist = carry
    if rule.history:
      return rule.step(grid, variables, x, hist, i, key, y_B)
    return rule.step(grid, variables, x, i, key, y_B), hist

  def init_fn(rng, num):
    return jax.random.normal(rng, (num,) + tuple(sample_shape), jnp.float32)

  return init_fn, step_fn, steps, rule


def check_labels(y, num, num_classes):
  """Checks a concrete class label (or labels) and broadcasts it to (num,); None stays None."""
  if y is None:
    return None
  if not num_classes:
    raise ValueError("y was given but the model is unconditional (num_classes = 0)")
  if not isinstance(y, jax.core.Tracer):
    y_np = np.asarray(y)
    if y_np.size and (y_np.min() < 0 or y_np.max() >= num_classes):
      raise ValueError(f"class {y_np.min() if y_np.min() < 0 else y_np.max()} is outside the "
                       f"trained range 0..{num_classes - 1}")
  return jnp.broadcast_to(jnp.asarray(y, jnp.int32), (num,))


def make_sampler(apply_fn: Callable, path, *, sampler: str = "heun", steps: int = 50,
                 sample_shape=(2,), prediction: str = "velocity", eta: float = 0.0,
                 guidance: float | None = None, num_classes: int = 0, t_end: float = 1.0,
                 clip_x0: float | None = None, return_trajectory: bool = False,
                 spacing: str | None = None, rho: float = 7.0, s_churn: float = 0.0,
                 s_tmin: float = 0.0, s_tmax: float | None = None, s_noise: float = 1.0):
  """Builds a jitted sampler for a denoiser trained on `path`.

  Args:
    apply_fn: `apply_fn(variables, x_t, t_1, y=y_B or None, train=False) -> out` (the denoiser
      convention; `t_1` is `path.model_time(t)` with shape (1,), shared by the batch; y = None
      or the null class means unconditional).
    path: `paths.FlowPath()`, a `paths.DDPMPath` or a `paths.EDMPath` (`paths.make_path`).
    sampler: a name in `SAMPLERS`: 'ddpm' (ancestral), 'ddim', 'euler' or 'heun' (the last two
      need a continuous path), 'edm_heun', 'dpmpp_2m', 'dpmpp_3m', or one added with
      `register_sampler`. A path may refuse one (`path.refuses`: 'heun' on EDM).
    steps: number of updates N >= the rule's order (network calls: N; 2N for Heun, 2N - 1 for
      EDM-Heun to sigma = 0; doubled under guidance). On a DDPM path the grid is an integer
      sub-sequence of T..0, steps <= T.
    sample_shape: shape of one sample, e.g. (2,) or (8, 8, 1).
    prediction: the network's output, one of `path.predictions`: 'velocity' or 'x0' on the flow,
      'eps', 'x0' or 'v' on DDPM, 'edm', 'v', 'eps' or 'x0' on EDM (`paths.to_x_eps`); another
      raises ValueError.
    eta: DDIM noise scale, c^2 = eta^2 sigma_s^2 (1 - SNR_t/SNR_s); 0 is deterministic.
    guidance: w in out~ = out(x) + w (out(x, c) - out(x)); None samples with y as given
      (unconditional if y is None). Needs num_classes > 0.
    num_classes: K classes of a conditional model; class K is the null class.
    t_end: final flow time (< 1 when the field is singular at t = 1, e.g. the two-point field).
    clip_x0: clip x_hat to [-clip_x0, clip_x0] at each step (pixel data), or None.
    return_trajectory: also return x_t at every grid point, shape (N + 1, B, ...), noise first
      (in the path's coordinates: on EDM the data end holds x / sigma_data).
    spacing: None (the path's own grid), 'time', 'logsnr' or 'karras' (`spacings.time_grid`);
      rho: Karras's exponent, > 0.
    s_churn, s_tmin, s_tmax, s_noise: EDM-Heun's churn: gamma = min(s_churn / N, sqrt 2 - 1)
      where s_tmin <= sigma_ve <= s_tmax (None: no upper bound), fresh noise scaled by s_noise;
      s_churn = 0 (the default) is the deterministic sampler.

  Returns:
    `sample(variables, rng, num, y=None, x_init=None)` -> x_B... (or (x_B..., traj_N1xB...)):
    starts from x_init (num, *sample_shape) if given, else eps ~ N(0, I) drawn from `rng`, and
    runs the N updates as one `lax.scan`; step i uses the key fold_in(rng_loop, i); returns
    path.data_scale x_N. `y` is an int or (num,) ints in 0..K-1, checked before the compiled call.
  """
  init_fn, step_fn, n, rule = build_parts(
      apply_fn, path, sampler=sampler, steps=steps, sample_shape=sample_shape,
      prediction=prediction, eta=eta, guidance=guidance, num_classes=num_classes, t_end=t_end,
      clip_x0=clip_x0, spacing=spacing, rho=rho, s_churn=s_churn, s_tmin=s_tmin, s_tmax=s_tmax,
      s_noise=s_noise)
  needs_y = guidance is not None
  data_scale = path.data_scale

  def core(variables, rng, num, y_B, x_init):
    k_init, k_loop = jax.random.split(rng)
    x0 = init_fn(k_init, num) if x_init is None else jnp.asarray(x_init, jnp.float32)

    def body(carry, i):
      carry = step_fn(variables, carry, i, jax.random.fold_in(k_loop, i), y_B)
      return carry, (carry[0] if return_trajectory else None)

    (x, _), traj = jax.lax.scan(body, (x0, solvers.init_history(x0, rule.history)),
                                jnp.arange(n))
    if return_trajectory:
      return x * data_scale, jnp.concatenate([x0[None], traj])
    return x * data_scale

  core_jit = jax.jit(core, static_argnums=(2,))

  def sample(variables, rng, num: int, y=None, x_init=None):
    if needs_y and y is None:
      raise ValueError("guidance needs a class y to guide towards; got y=None")
    if x_init is not None and tuple(x_init.shape) != (int(num),) + tuple(sample_shape):
      raise ValueError(f"x_init has shape {tuple(x_init.shape)}; expected "
                       f"{(int(num),) + tuple(sample_shape)}")
    return core_jit(variables, rng, int(num), check_labels(y, int(num), num_classes), x_init)

  sample.n_steps = n
  return sample
