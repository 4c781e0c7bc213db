"""Passkey retrieval vs context length: a small GPT must answer a key stated thousands of tokens
back; a context shorter than that distance cannot see it.

Run:
  jaxdl train long_context              # contexts 4096 (sees the key) and 512 (cannot)
  jaxdl train long_context:context=512  # one context only (any C > 0; model.block_size = C)
  jaxdl train long_context:smoke        # tiny documents, a few steps, for tests

Setup: `passkey` data (`jaxdl.data.passkey`): a 4-digit key ("The pass key is 4821. ", each
digit its own ten tokens) at a random distance of 2048-3072 tokens before the question
("What is the pass key? " and an ASK token), the rest stdlib source bytes; the model sees a
document's last C tokens and is scored only on the 4 answer digits (task `lm`, its data's
loss_mask; chance 0.1 a digit). A context of 512 never holds the key, one of 4096 always does.
GPT d 64, 2 layers, 4 heads, RoPE, block_size C, `model.remat='dots_no_batch'` (no B x H x T x T
kept for the backward pass) and `train.loss_chunk=512`; AdamW 3e-3, batch 8, warmup then
cosine. The experiment's own run is the first context, in <workdir>; its after_training
(`jaxdl.course.studies.train_variants`) trains the others into <workdir>/C<C> and writes
results.json (eval accuracy at the answer digits, eval loss, whole keys right, wall seconds).

Where this goes next: contexts past one device's memory are what the `parallel.sequence` mesh
axis (ring attention, issue 51) splits across devices; the experiment then runs unchanged with
`--set parallel.sequence=S`.

Expected: measured below.
"""

from jaxdl.config import base_config, parse_arg, smoke
from jaxdl.course import studies
from jaxdl.data import default_data_config
from jaxdl.data.passkey import vocab_size
from jaxdl.models import model_config
from jaxdl.optim import default_optim_config

CONTEXTS = (4096, 512)


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, context=0)
  c = base_config()
  c.name, c.task = "long_context", "lm"
  c.description = "Passkey retrieval thousands of tokens back: context lengths that see it or not"
  c.contexts = (args.context,) if args.context else CONTEXTS
  c.data = default_data_config("passkey")
  c.data.update(distance=2048, spread=1024, digits=4, batch_size=8, eval_batch_size=8,
                n_eval=128, context_length=c.contexts[0])
  c.model = model_config("gpt", vocab_size=vocab_size(c.data.digits), block_size=c.contexts[0],
                         n_layer=2, d_model=64, n_head=4, pos="rope", remat="dots_no_batch")
  c.optim = default_optim_config("adamw", lr=3e-3, weight_decay=0.1)
  c.train.update(steps=600, eval_every=200, log_every=20, ckpt_every=200, loss_chunk=512,
                 plot=False)
  if args.smoke:
    # Documents of ~120 tokens: the contract end to end, not the result.
    c.data.update(distance=48, spread=16, n=64, n_eval=8, max_bytes=100_000)
    c.contexts = (args.context,) if args.context else (96,)
    c.data.context_length = c.model.block_size = c.contexts[0]
    c.model.update(n_layer=1, d_model=32)
    c.train.loss_chunk = 32
    smoke(c, steps=4, eval_every=4, ckpt_every=4)
  return c


def after_training(config, workdir, summary):
  """The other contexts (<workdir>/C<C>): accuracy at the answer digits, loss, seconds."""

  def measure(c, directory, s):
    return {"context": c.data.context_length, "eval_accuracy": s["eval"]["accuracy"],
            "eval_loss": s["eval"]["loss"], "steps": s["step"],
            "seconds": s.get("train_seconds")}

  variants = {f"C{t}": {"data.context_length": t, "model.block_size": t}
              for t in config.contexts}
  return studies.train_variants(config, workdir, summary, variants, measure,
                                main=f"C{config.data.context_length}")
