"""GAN on the 8-Gaussian toy: modes covered and energy distance, without and with R1.

Run:
  jaxdl train experiments/gan_toy2d.py                # no R1; workdir runs/gan_toy2d
  jaxdl train experiments/gan_toy2d.py:r1             # R1 penalty gamma = 1 on real data
  jaxdl train experiments/gan_toy2d.py:collapse       # alternating, G lr 1e-2 vs D lr 1e-4
  jaxdl train experiments/gan_toy2d.py:collapse,r1    # the same with R1
  jaxdl train experiments/gan_toy2d.py:alternating    # alternating, both players at lr 1e-3
  jaxdl train experiments/gan_toy2d.py:alternating,r1 # the same with R1
  jaxdl train gan_toy2d:smoke                         # a few steps, for tests
  jaxdl sample runs/gan_toy2d --num 2000 --out gan.png  # one generator call per sample

Setup: 8 Gaussians (std 0.2, centres on a circle of radius 2), standardized, 50,000 points; MLP
generator (16-dim z) and discriminator (2 x 128, leaky ReLU), non-saturating losses, both players
updated simultaneously by one objective, or alternately with per-player learning rates
(`jaxdl.generative.gan`); Adam (b1 = 0.5) 1e-3 with warmup-cosine, batch 256, 5,000 steps. After
training, `after_training` (`jaxdl.generative.mode_coverage`) draws 2,000 samples and reports the
modes covered (>= 1/4 of a mode's fair share within 3 std of its centre), the fraction of samples
near any mode, and the energy distance to 2,000 fresh points beside the two-draw floor. Writes
gan_eval.json and gan_samples.png.

Expected (issue 17's target): the stabilized config covers >= 7 of 8 modes. Measured (one run
each, seed 0, 2,000 samples, floor = two fresh target draws, 3.4e-3; fair share 250 per mode):
- default (simultaneous, no R1): 8 of 8 modes covered but unevenly (101 to 294 per mode);
  energy distance 5.3x the floor: uneven mode mass, not a full collapse.
- :r1 (gamma = 1): 8 of 8, 191 to 239 per mode; 1.7x the floor.
- no R1 at lr 5e-3 (`--set optim.lr=0.005`): still 8 of 8 (95 to 288 per mode), 4.5x.
- no R1 at lr 1e-2 with b1 = 0.9 (`--set optim.lr=0.01 --set optim.b1=0.9`): 8 of 8 (108 to
  272), 5.5x. A large shared lr alone did not collapse this toy.
Mode collapse, shown and fixed (alternating updates, `gen.updates`):
- :collapse (G lr 1e-2, D lr 1e-4): 2 of 8 modes (276 and 84 samples, the other six 0; 18% of
  samples near any mode); 126x the floor. Our reading: a discriminator this slow cannot push
  the generator off the modes it has found.
- :collapse,r1: 0 of 8 (15 of 2,000 samples near a mode), 199x: R1 smooths D but does not make
  a discriminator that barely learns keep up, so it does not fix this collapse.
- :alternating (both players at lr 1e-3, no R1): 8 of 8, 136 to 276 per mode; 2.2x the floor.
- :alternating,r1: 8 of 8, 160 to 212 per mode; 2.2x. Balancing the players' learning rates is
  the fix here; R1 on top evens out the mode mass.
"""

from jaxdl.config import parse_arg, smoke
from jaxdl.course.generative_configs import gan_optim, generative_base
from jaxdl.generative import mode_coverage
from jaxdl.generative.settings import default_gen_config
from jaxdl.models import model_config


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, r1=False, alternating=False, collapse=False)
  c = generative_base("gan", "gan_toy2d", "toy2d", batch_size=256, steps=5000, every=1000,
                      log_every=200)
  c.description = "GAN on 8 Gaussians: modes covered and energy distance, without and with R1"
  c.data.update(distribution="8gaussians", n=50_000, n_eval=2_000)
  c.model = model_config("gan")  # 16-dim z, 2 x 128 leaky-ReLU generator and discriminator
  c.gen = default_gen_config("gan")
  c.gen.r1 = 1.0 if args.r1 else 0.0
  if args.alternating or args.collapse:
    c.gen.updates = "alternating"
  if args.collapse:  # a generator 100x faster than a discriminator that cannot keep up
    c.gen.g_lr, c.gen.d_lr = 1e-2, 1e-4
  c.optim = gan_optim(1e-3)
  if args.smoke:
    smoke(c)
    c.data.update(n=2000, n_eval=256)
    c.gen.eval_num = 200
  return c


after_training = mode_coverage.evaluate_gan_toy2d  # `jaxdl train` calls it once trained
