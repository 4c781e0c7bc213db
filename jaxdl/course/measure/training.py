"""Training-level measurements: the flow field for +-1 data, decoupled decay, BatchNorm on
moons, and example loss curves for the doctor.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


# ------------------------------------------------------------------------- generative


def two_point_field(variables, x, t_B, y=None, train=False):
  """The exact flow field v*(x, t) for data +-1 as a denoiser `apply_fn` (`make_sampler`)."""
  del variables, y, train
  from jaxdl.generative import closed_forms
  return closed_forms.two_point_posterior_velocity(x, t_B.reshape(t_B.shape + (1,) * (x.ndim - 1)))


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


def batchnorm_moons_curves(plain, bn, steps: int = 200) -> dict:
  """Per-step BCE training loss of experiments/moons_mlp.py without and with its 'bn' arg (the
  configs `plain` and `bn`).

  Each run is `jaxdl.train.run` for `steps` full-batch epochs in a temporary workdir; returns
  {'plain': (steps_S, loss_S), 'bn': (steps_S, loss_S)} from the runs' metrics.jsonl. The loss of
  step s is the training-mode loss (BatchNorm on batch statistics) before update s.
  """
  import tempfile
  from jaxdl.config import variant_config
  from jaxdl.train import run
  from jaxdl.train.writers import read_metrics
  out = {}
  for name, config in (("plain", plain), ("bn", bn)):
    config = variant_config(config, {"train.steps": steps, "train.plot": False,
                                     "train.log_every": 1, "train.ckpt_every": steps,
                                     "train.eval_every": steps})
    with tempfile.TemporaryDirectory() as workdir:
      run(config, workdir, progress=False)
      records = read_metrics(workdir, "train")
    out[name] = (np.array([r["step"] for r in records]), np.array([r["loss"] for r in records]))
  return out


def batchnorm_moons_losses(plain, bn, seeds=(0, 1, 2), steps: int = 200) -> dict:
  """Per-step BCE training loss of experiments/moons_mlp.py without and with its 'bn' arg (the
  configs `plain` and `bn`), over S seeds: {'plain': loss_SxT, 'bn': loss_SxT}, T = `steps`.

  The same updates as `jaxdl.train.run` (`batchnorm_moons_curves`) with `seed=k`: the config's
  model, task, optimizer and train step (`jaxdl.train.make_train_step`), and `build`'s keys of
  seed k, (init key, base key) = split(PRNGKey(k)). Each setting is one compiled program, the
  S seeds vmapped and the T steps scanned, so more seeds cost compute, not compiles. Every step
  sees the whole make_moons draw (batch = n; the draw is data_seed's, not the run's seed);
  run()'s per-epoch shuffle only permutes it, which changes neither the mean BCE nor
  BatchNorm's batch statistics, so the loss of step s (before update s) is run()'s up to float
  summation order (equal to ~1e-7 over the first steps; the BN curve oscillates at this lr, so
  later steps drift apart).
  """
  from jaxdl.config import variant_config
  from jaxdl.train import build, make_train_step
  keys_Sx2 = jnp.stack([jax.random.split(jax.random.PRNGKey(k)) for k in seeds])
  out = {}
  for name, config in (("plain", plain), ("bn", bn)):
    r = build(variant_config(config, {"train.steps": steps}))
    batch = next(r.ds.train_iter(process_index=0, process_count=1))
    assert len(jax.tree.leaves(batch)[0]) == r.ds.source.train.num, "moons_mlp is full-batch"

    def losses_T(keys, r=r, batch=batch):
      init_key, base_key = keys
      train_step = make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule, base_key)

      def body(state, _):
        state, metrics = train_step(state, batch)
        return state, metrics["loss"]

      return jax.lax.scan(body, r.init_fn()(init_key), None, length=steps)[1]

    out[name] = np.asarray(jax.jit(jax.vmap(losses_T))(keys_Sx2))
  return out


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
