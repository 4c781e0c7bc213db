"""GAN on 8x8 digits: one-call samples judged by the digits_cnn classifier.

Run:
  jaxdl train experiments/gan_digits.py               # workdir runs/gan_digits
  jaxdl sample runs/gan_digits --num 64 --out gan.png # one generator call per sample

Setup: sklearn digits scaled to [-1, 1] (the training split); the 'gan' model's MLP generator
(32-dim z, 2 x 256, leaky ReLU) and discriminator, non-saturating losses, R1 gamma = 1 on real
data, simultaneous updates (`jaxdl.generative.gan`); Adam (b1 = 0.5) 5e-4 with warmup-cosine,
batch 128, 20,000 steps (4.5 min on the 2-core CPU). After training, `after_training` trains the
judge (the digits_cnn experiment into <workdir>/classifier, reused when present), draws
`gen.eval_num` samples and reports the fraction the judge labels with confidence >= 0.9 and the
class histogram (a class with few samples is the image analogue of a dropped mode).

Issue 17's target, >= 80% of samples labelled with confidence >= 0.9, is met. Expected, as
measured at the default config (one run, seed 0): 88.0% of 500 samples (key 0), 87.5% of 5,000
(key 1); every class drawn (415 to 569 of 5,000 per class: no dropped digit). The number of
steps is what mattered: at 6,000 steps the same config gave 75.2% / 76.5% (404 to 632 per
class), R1 gamma = 0.1 77.6% / 74.9%, and a parameter average (`--set optim.ema_decay=0.999`,
which `jaxdl sample` and the judge then read) 76.2% at 6,000 steps and 87.0% / 88.1% at 20,000,
no better than the last iterate.
"""

from jaxdl.config import parse_arg, smoke
from jaxdl.course import digits_judge
from jaxdl.course.generative_configs import gan_optim, generative_base
from jaxdl.generative.settings import default_gen_config
from jaxdl.models import model_config


def get_config(arg=None):
  c = generative_base("gan", "gan_digits", "digits", batch_size=128, steps=20_000, every=5000,
                      log_every=200)
  c.description = "GAN on digits: one-call samples judged by a CNN"
  c.model = model_config("gan", data_shape=(8, 8, 1), latent=32, hidden=(256, 256))
  c.gen = default_gen_config("gan")
  c.gen.r1 = 1.0
  c.gen.sample_shape = (8, 8, 1)
  c.gen.eval_num = 500
  c.optim = gan_optim(5e-4)
  if parse_arg(arg, smoke=False).smoke:
    smoke(c)
    c.model.hidden = (32,)
    c.gen.eval_num = 20
  return c


after_training = digits_judge.one_call_check  # `jaxdl train` calls it once trained
