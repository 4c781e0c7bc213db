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

Shapes: B samples, N steps; x_B... is a batch of samples of `sample_shape`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.generative import paths as paths_lib

SAMPLERS = ("ddpm", "ddim", "euler", "heun")


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


def _build(apply_fn, path, *, sampler, steps, sample_shape, prediction, eta, guidance,
           num_classes, t_end, clip_x0):
  """Validates the settings and returns (init_fn, step_fn, n_steps), shared by both loops."""
  if sampler not in SAMPLERS:
    raise ValueError(f"sampler={sampler!r}: expected one of {SAMPLERS}")
  if not isinstance(steps, (int, np.integer)) or steps < 1:
    raise ValueError(f"steps={steps!r}: the number of sampler steps must be an integer >= 1")
  if sampler in ("euler", "heun") and not path.continuous:
    raise ValueError(f"sampler={sampler!r} integrates an ODE in continuous time and needs the "
                     f"'flow' path; for a {path.name!r} path use 'ddim' or 'ddpm'")
  # The conversions to (x_hat, eps_hat) hold only on their paths: elsewhere they would return
  # a wrong x_hat silently, so a prediction that does not fit the path is refused here.
  paths_lib.check_prediction(prediction, path)
  if guidance is not None and not num_classes:
    raise ValueError(f"guidance={guidance}: classifier-free guidance needs a class-conditional "
                     "model (num_classes > 0 with a null class); this model is unconditional")
  if eta < 0:
    raise ValueError(f"eta={eta}: expected eta >= 0")

  t_N1 = path.time_grid(steps, t_end) if path.continuous else path.time_grid(steps)
  alpha_N1, sigma_N1 = (np.asarray(a, np.float64) for a in path.alpha_sigma(t_N1))
  consts = dict(
      t=jnp.asarray(t_N1, jnp.float32), tm=jnp.asarray(path.model_time(t_N1), jnp.float32),
      alpha=jnp.asarray(alpha_N1, jnp.float32), sigma=jnp.asarray(sigma_N1, jnp.float32))
  if path.continuous:
    da, ds = path.d_alpha_sigma(t_N1)
  null_class = num_classes if num_classes else None

  def predict(variables, x, j, y_B):
    """(x_hat, eps_hat, raw output) at grid point j."""
    # Every sample is at the same time: pass it once, shape (1,), so that a denoiser can embed it
    # once and broadcast (per-sample (B,) times are for training).
    tm_1 = consts["tm"][j][None]
    out = guided_output(apply_fn, variables, x, tm_1, y_B, guidance, null_class)
    x_hat, eps_hat = paths_lib.to_x_eps(out, x, consts["alpha"][j], consts["sigma"][j], prediction)
    if clip_x0 is not None:
      x_hat = jnp.clip(x_hat, -clip_x0, clip_x0)
      eps_hat = paths_lib.x0_to_eps(x, x_hat, consts["alpha"][j], consts["sigma"][j])
    return x_hat, eps_hat, out

  def velocity(variables, x, j, y_B):
    x_hat, eps_hat, out = predict(variables, x, j, y_B)
    if prediction == "velocity" and clip_x0 is None:
      return out  # the network output is already dx/dt; skip a round trip through (x_hat, eps_hat)
    return da * x_hat + ds * eps_hat

  def step_fn(variables, x, i, key, y_B):
    a_t, s_t = consts["alpha"][i], consts["sigma"][i]
    a_s, s_s = consts["alpha"][i + 1], consts["sigma"][i + 1]
    if sampler in ("euler", "heun"):
      h = consts["t"][i + 1] - consts["t"][i]
      v1 = velocity(variables, x, i, y_B)
      x_e = x + h * v1
      if sampler == "euler":
        return x_e
      return x + 0.5 * h * (v1 + velocity(variables, x_e, i + 1, y_B))
    x_hat, eps_hat, _ = predict(variables, x, i, y_B)
    z = jax.random.normal(key, x.shape, x.dtype)
    if sampler == "ddim":
      return ddim_update(x_hat, eps_hat, a_t, s_t, a_s, s_s, eta, z if eta > 0 else None)
    mean, var = ancestral_mean_var(x, x_hat, a_t, s_t, a_s, s_s)
    return mean + jnp.sqrt(jnp.maximum(var, 0.0)) * z

  def init_fn(rng, num):
    return jax.random.normal(rng, (num,) + tuple(sample_shape), jnp.float32)

  return init_fn, step_fn, steps


def _check_y(y, num, num_classes):
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
                 clip_x0: float | None = None, return_trajectory: bool = False):
  """Builds a jitted sampler for a denoiser trained on `path`.

  Args:
    apply_fn: `apply_fn(variables, x_t, t_1, y=y_B or None, train=False) -> out` (the denoiser
      convention; `t_1` is `path.model_time(t)` with shape (1,), shared by the batch; y = None
      or the null class means unconditional).
    path: `paths.FlowPath()` or a `paths.DDPMPath` (see `paths.make_path`).
    sampler: 'ddpm' (ancestral), 'ddim', 'euler' or 'heun' (the last two need the flow path).
    steps: number of updates N >= 1 (network calls: N, 2N for Heun, doubled under guidance).
      On a DDPM path the grid is an evenly spaced integer sub-sequence of T..0, steps <= T.
    sample_shape: shape of one sample, e.g. (2,) or (8, 8, 1).
    prediction: the network's output, one of `path.predictions`: 'velocity' or 'x0' on the flow,
      'eps', 'x0' or 'v' on DDPM (see `paths.to_x_eps`); another raises ValueError.
    eta: DDIM noise scale, c^2 = eta^2 sigma_s^2 (1 - SNR_t/SNR_s); 0 is deterministic.
    guidance: w in out~ = out(x) + w (out(x, c) - out(x)); None samples with y as given
      (unconditional if y is None). Needs num_classes > 0.
    num_classes: K classes of a conditional model; class K is the null class.
    t_end: final flow time (< 1 when the field is singular at t = 1, e.g. the two-point field).
    clip_x0: clip x_hat to [-clip_x0, clip_x0] at each step (pixel data), or None.
    return_trajectory: also return x at every grid point, shape (N + 1, B, ...), noise first.

  Returns:
    `sample(variables, rng, num, y=None, x_init=None)` -> x_B... (or (x_B..., traj_N1xB...)):
    starts from x_init (num, *sample_shape) if given, else eps ~ N(0, I) drawn from `rng`, and
    runs the N updates as one `lax.scan`; step i uses the key fold_in(rng_loop, i). `y` is an
    int or (num,) ints in 0..K-1, checked before the compiled call.
  """
  init_fn, step_fn, n = _build(apply_fn, path, sampler=sampler, steps=steps,
                               sample_shape=sample_shape, prediction=prediction, eta=eta,
                               guidance=guidance, num_classes=num_classes, t_end=t_end,
                               clip_x0=clip_x0)
  needs_y = guidance is not None

  def core(variables, rng, num, y_B, x_init):
    k_init, k_loop = jax.random.split(rng)
    x0 = init_fn(k_init, num) if x_init is None else jnp.asarray(x_init, jnp.float32)

    def body(x, i):
      x = step_fn(variables, x, i, jax.random.fold_in(k_loop, i), y_B)
      return x, (x if return_trajectory else None)

    x, traj = jax.lax.scan(body, x0, jnp.arange(n))
    if return_trajectory:
      return x, jnp.concatenate([x0[None], traj])
    return x

  core_jit = jax.jit(core, static_argnums=(2,))

  def sample(variables, rng, num: int, y=None, x_init=None):
    if needs_y and y is None:
      raise ValueError("guidance needs a class y to guide towards; got y=None")
    if x_init is not None and tuple(x_init.shape) != (int(num),) + tuple(sample_shape):
      raise ValueError(f"x_init has shape {tuple(x_init.shape)}; expected "
                       f"{(int(num),) + tuple(sample_shape)}")
    return core_jit(variables, rng, int(num), _check_y(y, int(num), num_classes), x_init)

  sample.n_steps = n
  return sample


def make_python_loop_sampler(apply_fn: Callable, path, *, sampler: str = "heun", steps: int = 50,
                             sample_shape=(2,), prediction: str = "velocity", eta: float = 0.0,
                             guidance: float | None = None, num_classes: int = 0,
                             t_end: float = 1.0, clip_x0: float | None = None):
  """The same sampler as a Python loop over a jitted single step (for `jaxdl bench` and tests).

  Same arguments and same samples as `make_sampler` (same keys, same update), one dispatch per step.
  """
  init_fn, step_fn, n = _build(apply_fn, path, sampler=sampler, steps=steps,
                               sample_shape=sample_shape, prediction=prediction, eta=eta,
                               guidance=guidance, num_classes=num_classes, t_end=t_end,
                               clip_x0=clip_x0)
  step_jit = jax.jit(step_fn)
  init_jit = jax.jit(init_fn, static_argnums=(1,))

  def sample(variables, rng, num: int, y=None, x_init=None):
    y_B = _check_y(y, int(num), num_classes)
    k_init, k_loop = jax.random.split(rng)
    x = init_jit(k_init, int(num)) if x_init is None else jnp.asarray(x_init, jnp.float32)
    for i in range(n):
      x = step_jit(variables, x, jnp.asarray(i), jax.random.fold_in(k_loop, i), y_B)
    return x

  return sample
