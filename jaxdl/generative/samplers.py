"""Samplers for Gaussian paths, each a single `jax.lax.scan` over a precomputed time grid.

`make_sampler(apply_fn, path, **settings)` returns `sample(variables, rng, num, y=None) -> x_B...`:
one jitted program, no Python loop around the model. Its settings, with their defaults and checks,
are declared once, in `SamplerSettings` (a run's `gen` section inherits them,
`jaxdl.generative.settings.PathSettings`; `jaxdl.generative.stepwise` takes the same). The grid
runs from noise to data (`jaxdl.generative.spacings`: the path's own, or spaced evenly in t, the
log-SNR or Karras's sigma^(1/rho)); step i goes from t_i to t_{i+1}. The updates, 'ddpm'
(ancestral), 'ddim', 'euler', 'heun', 'edm_heun' (Karras et al.'s Heun with optional churn) and
'dpmpp_2m' / 'dpmpp_3m' (DPM-Solver++ multistep), are written with their equations in
`jaxdl.generative.solvers`. Classifier-free guidance mixes the raw outputs, out~ = out(x) +
w (out(x, c) - out(x)), with one batched call of size 2B per evaluation (the null class marks
"unconditional"); this is exact for eps, x0, v and velocity outputs alike because the conversions
are affine in the output.

Each update is one entry of `SAMPLERS`, a `SamplerRule`: a pure `step(grid, variables, x, i, key,
y_B) -> x_s`, the paths it runs on, its order, its network calls, registered with
`@register_sampler(name, ...)`; the `Grid` gives it the time grid, (alpha, sigma), eta and the
network as `grid.predict` (x_hat, eps_hat, out) and `grid.velocity` (dx/dt). A new sampler is
one such function: `make_sampler(..., sampler=name)` then finds it. A multistep rule (`history` =
k > 0) is `step(grid, variables, x, hist, i, key, y_B) -> (x_s, hist)` with k earlier arrays in
the scan's carry; a rule's `prepare` computes its per-step constants on the host (`grid.coef`).

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
from jaxdl.schema import (NONNEG, OPEN_FRACTION, POSITIVE, ConfigError, Settings, each, one_of,
                          setting)

ALL_PATHS = ("flow", "ddpm", "edm")
CONTINUOUS_PATHS = ("flow", "edm")  # where d x/dt exists: the ODE rules run here


@dataclasses.dataclass(frozen=True)
class SamplerRule:
  """A registered update: `step(grid, variables, x, i, key, y_B) -> x_{i+1}` from t_i to t_{i+1}.

  paths: the names of the paths it runs on (`path.name`); `refusals` maps another path's name to
    why not (one line), e.g. plain Heun on EDM calls the network at sigma = 0.
  order: the fewest steps the rule takes (a k-th order solver refuses N < k).
  calls: its sequential network calls per step (an int), or `calls(coef, N) -> int` for N steps
    when that depends on the grid (`coef`: what `prepare` returned, float64 numpy).
  history: k > 0 for a multistep rule, which carries k earlier arrays (see the module docstring).
  prepare: `prepare(path, t_N1, alpha_N1, sigma_N1, settings) -> dict` of per-step constants
    (float64 numpy arrays, computed once; `grid.coef`), or None.
  """
  step: Callable
  paths: tuple = ALL_PATHS
  order: int = 1
  calls: int | Callable = 1
  history: int = 0
  prepare: Callable | None = None
  refusals: Any = None  # dict: path name -> why the rule cannot run there

  def refusal(self, path) -> str | None:
    """Why the rule cannot run on `path` (one line, naming what to use), or None."""
    if path.name in self.paths:
      return None
    why = (self.refusals or {}).get(path.name)
    if why:
      return why
    runs = sorted(n for n, r in SAMPLERS.items() if path.name in r.paths)
    needs = ("works in continuous time and needs the 'flow' path"
             if set(self.paths) <= set(CONTINUOUS_PATHS) and not path.continuous
             else f"runs on the {', '.join(map(repr, self.paths))} paths")
    return f"it {needs}; for a {path.name!r} path use one of {runs}"

  def network_calls(self, steps: int, coef) -> int:
    """Sequential network calls of `steps` updates on the grid whose constants are `coef`."""
    return self.calls * steps if isinstance(self.calls, int) else int(self.calls(coef, steps))


# name -> SamplerRule, filled by @register_sampler below (and by any module that adds a sampler).
SAMPLERS: dict[str, SamplerRule] = {}


def register_sampler(name: str, **rule):
  """Decorator: registers `step(grid, variables, x, i, key, y_B) -> x_next` as sampler `name`
  (with history > 0: `step(grid, variables, x, hist, i, key, y_B) -> (x_next, hist)`); `rule`
  holds the other fields of `SamplerRule` (paths, order, calls, history, prepare, refusals)."""
  def register(step: Callable) -> Callable:
    if name in SAMPLERS:
      # A second registration would silently change what an existing config samples with.
      raise ValueError(f"sampler {name!r} is already registered: {sorted(SAMPLERS)}")
    SAMPLERS[name] = SamplerRule(step, **rule)
    return step
  return register


@dataclasses.dataclass(frozen=True)
class SamplerSettings(Settings):
  """Every setting of a Gaussian-path sampler, its default and its range, declared once.

  sampler: a name in `SAMPLERS`: 'ddpm' (ancestral), 'ddim', 'euler' or 'heun' (the last two
    need a continuous path), 'edm_heun', 'dpmpp_2m', 'dpmpp_3m', or one added with
    `register_sampler`. A rule runs on the paths it names (`SamplerRule.paths`).
  steps: number of updates N >= the rule's order (network calls: `SamplerRule.calls`, N for most,
    2N for Heun, 2N - 1 for EDM-Heun to sigma = 0; each call is 2B wide under guidance). On a
    DDPM path the grid is an integer sub-sequence of T..0, steps <= T.
  sample_shape: shape of one sample, e.g. (2,) or (8, 8, 1).
  prediction: the network's output, one of `path.predictions`: 'velocity' or 'x0' on the flow,
    'eps', 'x0' or 'v' on DDPM, 'edm', 'v', 'eps' or 'x0' on EDM (`paths.to_x_eps`).
  eta: DDIM noise scale, c^2 = eta^2 sigma_s^2 (1 - SNR_t/SNR_s); 0 is deterministic.
  guidance: w >= 0 in out~ = out(x) + w (out(x, c) - out(x)); None samples with y as given
    (unconditional if y is None). Needs num_classes > 0.
  num_classes: K classes of a conditional model; class K is the null class.
  t_end: final flow time (< 1 when the field is singular at t = 1, e.g. the two-point field).
  clip_x0: clip x_hat to [-clip_x0, clip_x0] at each step (pixel data), or None.
  spacing: None (the path's own grid), 'time', 'logsnr' or 'karras' (`spacings.time_grid`);
  rho: Karras's exponent of the 'karras' spacing, > 0.
  s_churn, s_tmin, s_tmax, s_noise: EDM-Heun's churn: gamma = min(s_churn / N, sqrt 2 - 1)
    where s_tmin <= sigma_ve <= s_tmax (None: no upper bound), fresh noise scaled by s_noise;
    s_churn = 0 (the default) is the deterministic sampler.
  """
  sampler: str = "heun"
  steps: int = setting(50, POSITIVE)
  sample_shape: tuple = setting((2,), each(POSITIVE))
  prediction: str = "velocity"
  eta: float = setting(0.0, NONNEG)
  guidance: float | None = setting(None, NONNEG)
  num_classes: int = setting(0, NONNEG)
  t_end: float = setting(1.0, OPEN_FRACTION)
  clip_x0: float | None = setting(None, POSITIVE)
  spacing: str | None = setting(None, one_of(*spacings.SPACINGS))
  rho: float = setting(paths_lib.KARRAS_RHO, POSITIVE)
  s_churn: float = setting(0.0, NONNEG)
  s_tmin: float = setting(0.0, NONNEG)
  s_tmax: float | None = setting(None, NONNEG)  # None: no upper bound
  s_noise: float = setting(1.0, NONNEG)

  def __post_init__(self):
    super().__post_init__()
    if self.sampler not in SAMPLERS:
      self.fail("sampler", f"expected one of {sorted(SAMPLERS)}, got {self.sampler!r}")
    if not isinstance(self.steps, (int, np.integer)):
      self.fail("steps", f"the number of sampler steps must be an integer, got {self.steps!r}")
    if self.steps < SAMPLERS[self.sampler].order:
      order = SAMPLERS[self.sampler].order
      self.fail("steps", f"sampler {self.sampler!r} is of order {order} and takes steps >= "
                f"{order}, got {self.steps}")
    if self.s_tmax is not None and self.s_tmax < self.s_tmin:
      self.fail("s_tmax", f"must be >= s_tmin = {self.s_tmin}, got {self.s_tmax}")
    if self.s_churn and self.sampler != "edm_heun":
      self.fail("s_churn", f"churn is an option of 'edm_heun', not {self.sampler!r}; got "
                f"{self.s_churn}")

  @classmethod
  def of(cls, **settings) -> "SamplerSettings":
    """`SamplerSettings(**settings)`, an unknown key refused in one line naming the known ones."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in settings if k not in known]
    if unknown:
      raise ConfigError(f"{unknown[0]}: not a sampler setting; expected one of {known}")
    return cls(**settings)

  @classmethod
  def pick(cls, settings, **overrides) -> "SamplerSettings":
    """The sampler settings of an object holding them (a run's `gen` settings), with
    `overrides` (a None override keeps the object's value)."""
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return cls.of(**values)


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
# Each update is its equation in `solvers`' docstring; here, what the registry knows of it.
register_sampler("ddpm")(solvers.ddpm)
register_sampler("ddim")(solvers.ddim)
register_sampler("euler", paths=CONTINUOUS_PATHS)(solvers.euler)
register_sampler("heun", paths=("flow",), calls=2, refusals={
    "edm": "it calls the network at sigma = 0, where c_noise = ln(0)/4; use 'edm_heun' (its "
           "last step is Euler)"})(solvers.heun)
register_sampler("edm_heun", order=2, calls=solvers.edm_heun_calls,
                 prepare=solvers.edm_heun_coefficients)(solvers.edm_heun)
register_sampler("dpmpp_2m", order=2, history=1,
                 prepare=solvers.multistep_coefficients(2))(solvers.dpmpp)
register_sampler("dpmpp_3m", order=3, history=2,
                 prepare=solvers.multistep_coefficients(3))(solvers.dpmpp)


def plan_grid(path, settings: SamplerSettings):
  """The host side of a sampler on `path`: (rule, t_N1, alpha_N1, sigma_N1, coef), float64
  numpy, once the rule is known to run on the path; its network calls are
  `rule.network_calls(steps, coef)`."""
  rule = SAMPLERS[settings.sampler]
  why = rule.refusal(path)
  if why:
    raise ConfigError(f"sampler={settings.sampler!r} cannot run on the {path.name!r} path: {why}")
  t_N1 = spacings.time_grid(path, settings.steps, settings.spacing, rho=settings.rho,
                            t_end=settings.t_end)
  alpha_N1, sigma_N1 = (np.asarray(a, np.float64) for a in path.alpha_sigma(t_N1))
  coef = (None if rule.prepare is None
          else rule.prepare(path, t_N1, alpha_N1, sigma_N1, settings))
  return rule, t_N1, alpha_N1, sigma_N1, coef


def network_calls(path, **settings) -> int:
  """Sequential network calls per sample of the sampler `settings` (`SamplerSettings`' keys:
  sampler, steps, spacing, rho, ...) describe on `path`, each one 2B wide under guidance;
  nothing is compiled (`make_sampler`'s `sample.calls` is the same number)."""
  settings = SamplerSettings.of(**settings)
  rule, *_, coef = plan_grid(path, settings)
  return rule.network_calls(settings.steps, coef)


def build_parts(apply_fn, path, settings: SamplerSettings):
  """Returns (init_fn, step_fn, rule, calls) of the sampler `settings` describe: the scan here
  and the one-step-at-a-time forms of `jaxdl.generative.stepwise` build from it."""
  rule, t_N1, alpha_N1, sigma_N1, coef_np = plan_grid(path, settings)
  # The conversions to (x_hat, eps_hat) hold only on their paths: elsewhere they would return
  # a wrong x_hat silently, so a prediction that does not fit the path is refused here.
  paths_lib.check_prediction(settings.prediction, path)
  if settings.guidance is not None and not settings.num_classes:
    raise ConfigError(f"guidance={settings.guidance}: classifier-free guidance needs a "
                      "class-conditional model (num_classes > 0 with a null class); this model "
                      "is unconditional")
  da, ds = path.d_alpha_sigma(t_N1) if path.continuous else (None, None)
  coef = None if coef_np is None else {
      k: jnp.asarray(v, jnp.bool_ if v.dtype == bool else jnp.float32)
      if isinstance(v, np.ndarray) else v for k, v in coef_np.items()}
  grid = Grid(
      t=jnp.asarray(t_N1, jnp.float32), tm=jnp.asarray(path.model_time(t_N1), jnp.float32),
      alpha=jnp.asarray(alpha_N1, jnp.float32), sigma=jnp.asarray(sigma_N1, jnp.float32),
      eta=settings.eta, d_alpha=da, d_sigma=ds, apply_fn=apply_fn,
      prediction=settings.prediction, guidance=settings.guidance,
      null_class=settings.num_classes or None,
      clip_x0=None if settings.clip_x0 is None else settings.clip_x0 / path.data_scale,
      coef=coef, model_time=path.model_time)

  def step_fn(variables, carry, i, key, y_B):
    """One update on the scan's carry (x, hist); hist is () for a one-step rule."""
    x, hist = carry
    if rule.history:
      return rule.step(grid, variables, x, hist, i, key, y_B)
    return rule.step(grid, variables, x, i, key, y_B), hist

  def init_fn(rng, num):
    return jax.random.normal(rng, (num,) + tuple(settings.sample_shape), jnp.float32)

  return init_fn, step_fn, rule, rule.network_calls(settings.steps, coef_np)


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


def latent_sampler(model, method: Callable) -> Callable:
  """`sample(variables, rng, num) -> x_num...` of a latent-variable model (VAE, GAN): z ~ N(0, I)
  of shape (num, model.latent), then one network call, `model.apply(..., method=method)`."""

  def sample(variables, rng, num: int):
    z_BxZ = jax.random.normal(rng, (num, model.latent), jnp.float32)
    return model.apply(variables, z_BxZ, method=method)

  return jax.jit(sample, static_argnums=2)


def make_sampler(apply_fn: Callable, path, *, return_trajectory: bool = False, **settings):
  """Builds a jitted sampler for a denoiser trained on `path`.

  Args:
    apply_fn: `apply_fn(variables, x_t, t_1, y=y_B or None, train=False) -> out` (the denoiser
      convention; `t_1` is `path.model_time(t)` with shape (1,), shared by the batch; y = None
      or the null class means unconditional).
    path: `paths.FlowPath()`, a `paths.DDPMPath` or a `paths.EDMPath` (`paths.make_path`).
    return_trajectory: also return x_t at every grid point, shape (N + 1, B, ...), noise first
      (in the path's coordinates: on EDM the data end holds x / sigma_data).
    **settings: the keys of `SamplerSettings` (sampler, steps, sample_shape, prediction, eta,
      guidance, num_classes, t_end, clip_x0, spacing, rho, s_churn, s_tmin, s_tmax, s_noise),
      each checked there; a key left out takes its default there. A bad one raises ConfigError.

  Returns:
    `sample(variables, rng, num, y=None, x_init=None)` -> x_B... (or (x_B..., traj_N1xB...)):
    starts from x_init (num, *sample_shape) if given, else eps ~ N(0, I) drawn from `rng`, and
    runs the N updates as one `lax.scan`; step i uses the key fold_in(rng_loop, i); returns
    path.data_scale x_N. `y` is an int or (num,) ints in 0..K-1, checked before the compiled call.
    `sample.calls` is the sequential network calls per sample, `sample.settings` the
    `SamplerSettings` it was built with.
  """
  settings = SamplerSettings.of(**settings)
  init_fn, step_fn, rule, calls = build_parts(apply_fn, path, settings)
  n, num_classes, sample_shape = settings.steps, settings.num_classes, settings.sample_shape
  needs_y = settings.guidance is not None
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

  sample.calls, sample.settings = calls, settings
  return sample
