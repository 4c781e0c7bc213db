"""Passkey retrieval vs context length: a small GPT must answer a key stated about two thousand
tokens back; a context shorter than that distance cannot see it.

Run:
  jaxdl train long_context              # contexts 2048 (sees the key) and 512 (cannot)
  jaxdl train long_context:context=512  # one context only (model.block_size = C; 0: both,
                                        # C < 0 refused in one line, exit 2)
  jaxdl train long_context:smoke        # documents of ~100 tokens, 4 steps, for tests

Setup: `passkey` data (`jaxdl.data.passkey`): "The pass key is 7. " (a one-digit key, its ten
values tokens of their own) at a random distance of 1,536-1,984 tokens before the question
("What is the pass key? " and an ASK token), the rest stdlib source bytes (the `text` source's
files; eval documents from its held-out files). The model sees a document's last C tokens and is
scored only on the answer (task `lm`, its data's loss_mask; chance 0.1). A context of 512 never
holds the key, one of 2048 always does. GPT d 64, 1 layer, 4 heads, learned positions,
block_size C; AdamW 3e-3, batch 8, warmup then cosine, 500 steps, 128 eval documents, seed 0.
The experiment's own run is the first context, in <workdir>; its after_training
(`jaxdl.course.studies.train_variants`) trains the others into <workdir>/C<C> and writes
results.json (eval accuracy and loss at the answer, steps, median seconds per step).

Memory levers (compiled temporary bytes of this train step, `jaxdl.bench.memory.temp_bytes`,
batch 8): at C = 2048 0.611 GB plain, 0.636 GB with `train.loss_chunk=512`, 0.611 GB with
`model.remat='dots_no_batch'`, 0.898 GB with 'full'; at C = 4096 2.30 GB plain and with both.
Neither helps at this size, so neither is on: one layer leaves nothing to drop between blocks,
the B x H x T x T attention buffers remain, and the logits are 8 x 2048 x 267 floats (17.5 MB).
Contexts past one device's memory are where the `parallel.sequence` mesh axis (ring attention)
applies: it splits these T x T buffers across devices (`--set parallel.sequence=S` on S or more
devices; the smoke run trains so on 2 emulated CPU devices).

Pilots (the same model, one-digit key at 1,024-1,792 tokens, C = 2048): eval accuracy 0.078 at
step 100, 0.625 at step 200. A four-digit key (each digit its own ten tokens) learned one digit
at a time: at C = 512 and distances 256-384, 0.33 after 600 steps; a 4096 context (distance
2,048-3,072, 2 layers) ran at 8-34 s a step on this shared CPU, out of reach of the budget.

Expected (measured once, seed 0, on the shared 2-core CPU at load average 3-6: 1,175 s wall,
964 CPU-s for both runs, past the ~15 minutes aimed at because of the load), eval accuracy and
loss at the answer over the 128 held-out documents after 500 steps:

  context C    sees the key    accuracy    loss     s / step (median)
  2048         always          1.000       0.027    2.01
  512          never           0.148       2.298    0.18

(chance: 0.1 and ln 10 = 2.303; 0.148 is 19 of 128, 1.8 binomial standard deviations above.)
C = 2048 at steps 100 / 200 / 300 / 400: accuracy 0.141, 0.289, 0.953, 1.000; C = 512 stays
within 0.070-0.148 and 2.298-2.350 throughout: with the key out of its window nothing in the
document predicts it.
"""

import numpy as np

from jaxdl.config import base_config, parse_arg, smoke
from jaxdl.course import studies
from jaxdl.data import default_data_config
from jaxdl.data.passkey import vocab_size
from jaxdl.models import model_config
from jaxdl.optim import default_optim_config
from jaxdl.train.writers import read_metrics

CONTEXTS = (2048, 512)


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, context=0)
  c = base_config()
  c.name, c.task = "long_context", "lm"
  c.description = "Passkey retrieval thousands of tokens back: context lengths that see it or not"
  c.contexts = (args.context,) if args.context else CONTEXTS
  c.data = default_data_config("passkey")
  c.data.update(distance=1536, spread=448, digits=1, batch_size=8, eval_batch_size=8,
                n_eval=128, context_length=c.contexts[0])
  c.model = model_config("gpt", vocab_size=vocab_size(c.data.digits), block_size=c.contexts[0],
                         n_layer=1, d_model=64, n_head=4)
  c.optim = default_optim_config("adamw", lr=3e-3, weight_decay=0.1)
  c.train.update(steps=500, eval_every=100, log_every=20, ckpt_every=100, plot=False)
  if args.smoke:
    # Documents of ~120 tokens: the contract end to end, not the result.
    c.data.update(distance=48, spread=16, n=64, n_eval=8, max_bytes=100_000)
    c.contexts = (args.context,) if args.context else (96,)
    c.data.context_length = c.model.block_size = c.contexts[0]
    c.model.d_model = 32
    smoke(c, steps=4, eval_every=4, ckpt_every=4)
  return c


def after_training(config, workdir, summary):
  """The other contexts (<workdir>/C<C>): accuracy at the answer digits, loss, seconds."""

  def measure(c, directory, s):
    rates = [r["steps_per_s"] for r in read_metrics(directory, "throughput")]
    return {"context": c.data.context_length, "eval_accuracy": s["eval"]["accuracy"],
            "eval_loss": s["eval"]["loss"], "steps": s["step"],
            "s_per_step": 1.0 / float(np.median(rates)) if rates else None}

  variants = {f"C{t}": {"data.context_length": t, "model.block_size": t}
              for t in config.contexts}
  return studies.train_variants(config, workdir, summary, variants, measure,
                                main=f"C{config.data.context_length}")
