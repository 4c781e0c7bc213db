"""VAE on 8x8 digits: ELBO in bits per dimension, active latent units, one-call samples judged.

Run:
  jaxdl train experiments/vae_digits.py               # workdir runs/vae_digits
  jaxdl train vae_digits:smoke                        # a few steps, for tests
  jaxdl sample runs/vae_digits --num 64 --out vae.png # one decoder call per sample

Setup: sklearn digits scaled to [-1, 1] (the training split); an MLP encoder (256, 256) to a
2-dim Gaussian q(z|x) (`:latent=N` for N dims) and a mirrored decoder to a Gaussian p(x|z) with
a learned sigma per pixel (floored at 0.01); loss (rec + beta KL) / 64, beta = 1, with one
reparameterized z per example; AdamW 1e-3 warmup-cosine, batch 128, 4,000 steps. After
training, `after_training` trains the judge (the digits_cnn experiment into <workdir>/classifier,
reused when present; the smoke config skips it), draws `gen.eval_num` samples (z ~ N(0, I), the
decoder's mean: one call) and reports the fraction the judge labels with confidence >= 0.9, the
class histogram, and the test split's ELBO and active units (Var_x E_q[z_j] > 0.01).

The test ELBO is a bound on a density over the continuous pixel space [-1, 1]^64, so it can be
positive (in nats): the never-varying corner pixels each add up to -log(0.01 sqrt(2 pi)) = 3.7
nats at the sigma floor. Issue 17's target, >= 80% of samples labelled with confidence >= 0.9,
is met at the default (2 latent dims).
Expected, as measured one run each, seed 0; confident fraction over
500 samples (key 0) / 5,000 samples (key 1); test ELBO in nats per image; active / latent units:
- latent 2 (default):             89.8% / 87.0%; ELBO -9.87, KL 5.8, 2 / 2 active.
- latent 4:                       81.8% / 80.5%; ELBO -2.63, KL 10.0, 4 / 4.
- latent 4, KL warmup 1,000 steps (`--set gen.kl_warmup=1000`): 79.8% / 80.7%; ELBO -2.65, 4 / 4.
- latent 4, beta 2:               83.8% / 81.7%; ELBO +0.96, KL 7.8, 4 / 4.
- latent 8:                       73.2% / 71.7%; ELBO +0.30, KL 17.3, 8 / 8.
- latent 16:                      70.6% (500 samples); ELBO +4.85, KL 18.6, 16 / 16.
- Bernoulli decoder on [0, 1] pixels (`--set model.decoder=bernoulli --set data.scale=unit`),
  latent 4: 81.8% / 81.7%, KL 3.8, 4 / 4; latent 8: 80.2% (500), KL 3.9, 5 / 8 active: posterior
  collapse of 3 units (the cross-entropy surrogate's ELBO, -23.9 nats, is not a density).
More latent dims buy a better bound and worse samples. Our reading: with more dims, more of the
prior's mass falls between the aggregate posterior's clusters, where the decoder's mean blends
digits the judge will not call.
The classes stay covered at every size (fewest draws of a class at latent 2: 343 of 5,000).
"""

import json
import pathlib

from _digits import train_classifier
from jaxdl.config import base_config, parse_arg
from jaxdl.data import default_data_config
from jaxdl.generative.vae import default_vae_config
from jaxdl.optim import default_optim_config

CONFIDENCE = 0.9


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, latent=2)
  c = base_config()
  c.name = "vae_digits"
  c.description = "VAE on digits: ELBO bits/dim, active units, one-call samples judged by a CNN"
  c.task = "vae"
  c.data = default_data_config("digits")
  c.data.scale = "symmetric"
  c.data.batch_size = 128
  c.model = dict(name="vae", data_shape=(8, 8, 1), latent=args.latent, hidden=(256, 256),
                 decoder="gaussian", sigma_min=0.01)
  c.gen = default_vae_config()
  c.gen.sample_shape = (8, 8, 1)
  c.gen.eval_num = 500
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.0
  c.optim.schedule.name = "warmup_cosine"
  c.train.steps = 4000
  c.train.eval_every = 1000
  c.train.log_every = 100
  c.train.ckpt_every = 1000
  if args.smoke:
    c.model.hidden = (32,)
    c.model.latent = 4
    c.gen.eval_num = 20
    c.train.steps = 20
    c.train.eval_every = 10
    c.train.ckpt_every = 10
  return c


def judge_samples(x_Nx8x8x1, classifier_dir, scale: str = "symmetric") -> dict:
  """The digits_cnn run in `classifier_dir` on samples in the data's `scale` ([-1, 1] when
  'symmetric', else [0, 1]): the fraction whose top class has probability >= CONFIDENCE, and
  how many samples each class gets."""
  import jax
  import numpy as np
  from jaxdl.train import load_run
  config, model, variables, _ = load_run(classifier_dir)
  x = np.asarray(x_Nx8x8x1)
  x = (np.clip(x, -1, 1) + 1) / 2 if scale == "symmetric" else np.clip(x, 0, 1)  # to 'unit'
  shape = tuple(config.model.get("image_shape", (8, 8, 1)))
  probs_NxK = np.asarray(jax.nn.softmax(model.apply(variables, x.reshape((-1,) + shape),
                                                    train=False)))
  return {"confident_fraction": float(np.mean(probs_NxK.max(1) >= CONFIDENCE)),
          "class_counts": np.bincount(probs_NxK.argmax(1), minlength=10).tolist()}


def after_training(config, workdir, summary):
  """Samples the final checkpoint (one decoder call) and judges it; writes generative_eval.json."""
  import jax
  from jaxdl.generative import vae
  from jaxdl.train import load_run
  _, model, variables, step = load_run(workdir)
  x = vae.make_run_sampler(config, model)(variables, jax.random.PRNGKey(0), config.gen.eval_num)
  out = {"step": int(step), "eval": {k: v for k, v in (summary or {}).get("eval", {}).items()}}
  if config.train.steps >= 1000:  # the smoke run skips training the judge
    out.update(judge_samples(x, train_classifier(workdir), config.data.scale))
  pathlib.Path(workdir, "generative_eval.json").write_text(json.dumps(out, indent=2))
  return {"generative": out}
