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

from jaxdl.config import parse_arg, smoke
from jaxdl.course import digits_judge
from jaxdl.course.generative_configs import generative_base
from jaxdl.generative.settings import default_gen_config
from jaxdl.models import model_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, latent=2)
  c = generative_base("vae", "vae_digits", "digits", batch_size=128, steps=4000, every=1000,
                      log_every=100)
  c.description = "VAE on digits: ELBO bits/dim, active units, one-call samples judged by a CNN"
  c.model = model_config("vae", latent=args.latent)  # MLP 256-256, Gaussian decoder, sigma >= 0.01
  c.gen = default_gen_config("vae")
  c.gen.sample_shape = (8, 8, 1)
  c.gen.eval_num = 500
  c.optim = default_optim_config("adamw", lr=1e-3, weight_decay=0.0)
  if args.smoke:
    smoke(c)
    c.model.update(hidden=(32,), latent=4)
    c.gen.eval_num = 20
  return c


after_training = digits_judge.one_call_check  # `jaxdl train` calls it once trained
