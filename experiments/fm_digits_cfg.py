"""Class-conditional flow matching on 8x8 digits with classifier-free guidance; classifier check.

Run:
  jaxdl train experiments/fm_digits_cfg.py            # workdir runs/fm_digits_cfg
  jaxdl train fm_digits_cfg:smoke                     # tiny U-Net, 60 steps, for tests

Setup: sklearn digits scaled to [-1, 1] (training split), a two-level conv U-Net (16/32 channels)
with a time embedding and 10 class embeddings plus a null class; velocity MSE with labels dropped
to the null class with probability 0.1; AdamW 2e-3 warmup-cosine, batch 64, 3,000 steps.
After training, `after_training` trains the judge (gen.classifier: the digits_cnn experiment into
<workdir>/classifier; the smoke config uses an RBF SVM on the training split, ~0.99 test
accuracy), draws 50 samples per class with Heun (25 steps, 50 network calls) and guidance w = 2,
writes digits_grid.png (one row per class) and reports the fraction that the judge labels as the
conditioning class.

Expected: class_accuracy >= 0.90 at the default guidance w = 2 (measured on 500 samples:
1.00 with a trained digits_cnn run as the classifier, 1.00 with the SVM).
"""

from jaxdl.course import digits_judge
from jaxdl.course.generative_configs import digits_config


def get_config(arg=None):
  c = digits_config("flow_matching", "fm_digits_cfg", arg)
  c.description = "Class-conditional flow matching on digits with guidance; classifier >= 90%"
  return c


after_training = digits_judge.class_check  # `jaxdl train` calls it once trained
