"""Pre-LN vs post-LN: gradient norms per block at initialization, and training with and without
warmup at the same peak learning rate.

Run:
  jaxdl train prepost_ln               # 4 training runs + the gradient norms at init
  jaxdl train prepost_ln:smoke         # 10 steps each, for tests

Setup: char_gpt's data (bytes of the stdlib's .py files, context 32, batch 16) and a GPT with
d 64, 6 layers, 4 heads, Xavier-uniform init (the original transformer's, and the setting of
Xiong et al., 2020); AdamW at peak lr 5e-3 (decay 0.1), no gradient clipping (clipping is itself
a cure for the early large steps), cosine decay to 10% over 150 steps, with no warmup or with 10%
linear warmup. Post-LN is x <- LN(x + F(x)) with no final norm; pre-LN is x <- x + F(LN(x))
plus a final LN (`jaxdl.models.transformer`). The gradient norms are ||d loss / d block l|| of
the fresh model on random tokens (`jaxdl.course.measure.block_grad_norms`).

Expected (measured on this project's 2-core CPU, seed 0):
  gradient norm per block 1..6 at init, pre-LN   0.208 0.124 0.104 0.082 0.074 0.065
                                        post-LN  0.637 0.107 0.111 0.103 0.101 0.098
  Pre-LN's norms shrink towards the output; post-LN's stay near flat from block 2 on, so the
  post/pre ratio grows from 0.86 at block 2 to 1.51 at block 6: post-LN has the larger gradients
  near the output (block 1's post-LN norm is large because its first LN rescales the raw
  embeddings). `jaxdl reproduce --only prepost_ln_grads` checks this. Over seeds 0-4 the block-6
  ratio is 1.444 [95% CI 1.339, 1.549]; both shapes hold in every seed.
  Eval loss after 150 steps (nats per byte; 5.55 at init):
                 no warmup   10% warmup
    pre-LN       2.912       2.928
    post-LN      3.255       3.255
  Post-LN without warmup lags pre-LN by 0.34 nats; pre-LN trains as well without warmup as with
  it. Warmup did not rescue post-LN at this lr and length: 10% gave the same 3.255. Single
  post-LN runs (evaluated on 128 windows instead of 256): 40% warmup 3.214; peak lr 1e-3 without
  warmup 2.979. At this scale post-LN needs a lower peak lr more than it needs warmup.
Layout: the experiment's own run is pre-LN without warmup, in <workdir>; its after_training
(`jaxdl.course.studies.layernorm_study`) measures the gradient norms and trains the other three
into <workdir>/<pre|post>_<warmup|no_warmup> (the numbers above were measured with all four in
subdirectories, the same configs); results.json holds them all.
"""

from jaxdl.config import parse_arg, smoke
from jaxdl.course import studies
from jaxdl.course.supervised_configs import stdlib_gpt


def get_config(arg=None):
  c = stdlib_gpt("prepost_ln",
                 "Pre-LN vs post-LN: block gradient norms at init, training with/without warmup")
  c.data.context_length = 32
  c.data.batch_size = 16
  c.model.update(block_size=32, n_layer=6, d_model=64, n_head=4, init_name="xavier")
  c.optim.lr = 5e-3
  c.optim.clip_norm = None
  c.optim.schedule.warmup_frac = 0.0  # the main run: pre-LN without warmup
  c.train.update(steps=150, eval_every=150, ckpt_every=150, plot=False)
  c.warmup_frac = 0.1  # the warmup of the runs with warmup
  if parse_arg(arg, smoke=False).smoke:
    smoke(c, steps=10, eval_every=10, ckpt_every=10)
    c.data.max_eval_windows = 32
  return c


def after_training(config, workdir, summary):
  """The gradient norms at init, then the other three layout x warmup runs (results.json)."""
  return studies.layernorm_study(config, workdir, summary)
