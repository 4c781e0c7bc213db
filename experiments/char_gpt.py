"""A small character-level GPT on the Python standard library's own source (byte level).

Run:
  jaxdl train                          # char_gpt is the default experiment
  jaxdl train char_gpt --set train.steps=3000   # longer, better samples
  jaxdl train char_gpt:smoke           # a few steps, for tests
  jaxdl train char_gpt:ssm             # every block's attention replaced by a selective SSM
  jaxdl train char_gpt:moe             # every block's MLP an 8-expert top-2 mixture of experts

Setup: bytes of the stdlib's .py files (2 MB cap, split by file), context 64, batch 32; a pre-LN
GPT with d 128, 4 layers, 4 heads, learned positions, tied embeddings, GELU MLP; AdamW 3e-3
(decay 0.1 on kernels), clipping at 1.0, 5% warmup then cosine to 10%, 800 steps.

Expected (2-core CPU: 2-4 minutes with compilation, measured 127 s earlier and 259 s on a slower
machine): validation loss about 1.64 nats per byte, i.e. about 2.37 bits per byte (measured 2.363;
ln 256 = 5.55 nats = 8 bits at init), and a printed 60-byte sample of code-like text (the
64-byte context bounds prompt + sample).

char_gpt:moe against the dense model of the same FLOPs per token (`--set model.mlp_hidden=1024`),
both `--set train.steps=200` (measured under a heavily loaded machine, loss only): validation
loss 2.625 (MoE, E=8, top-2) vs 2.322 nats per byte (dense), so at this length the MoE lags.
char_gpt:ssm (every block's attention replaced by the selective SSM, state 16, expand 2, conv 4:
1.28M parameters and 2.6 MFLOPs per token against 0.83M and 1.8M) against char_gpt, both
`--set train.steps=200`, measured on the 2-core CPU beside one other job: validation loss 1.807
nats per byte (2.61 bits) for the SSM vs 2.448 (3.53 bits) for attention, at 0.32 vs 1.75 steps
per second. At this short length the SSM, with its extra parameters, learns faster per step; on
this CPU its associative scan over B x T x E x N = 32 x 64 x 256 x 16 states per layer makes each
step 5.4x slower. The full 800 steps of char_gpt:ssm were not run (about 45 min here).
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.config import parse_arg, smoke
from jaxdl.course.supervised_configs import stdlib_gpt
from jaxdl.data import decode
from jaxdl.models import build_model
from jaxdl.models.decoding import make_generator
from jaxdl.train.checkpoint import load_state


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, ssm=False, moe=False)
  c = stdlib_gpt("char_gpt",
                 "Small byte-level GPT on the Python standard library's sources (bits per byte)")
  c.sample = dict(prompt="def ", max_new_tokens=60, temperature=0.8, top_k=40, seed=0)
  if args.ssm:
    c.model.mixer = "ssm"
  if args.moe:
    c.model.update(moe_experts=8, moe_top_k=2)
  if args.smoke:
    # The same architecture at a quarter of the width and half the depth, on 200 kB of text:
    # the smoke run checks the whole command, not the model's quality.
    smoke(c, steps=10, eval_every=5, ckpt_every=5)
    c.model.update(n_layer=2, d_model=64, scan_unroll=2)
    c.data.update(max_bytes=200_000, batch_size=16, max_eval_windows=32)
    c.sample.max_new_tokens = 16
  return c


def after_training(config, workdir, summary) -> dict:
  """Prints a sample from the trained model and the validation bits per byte."""
  _, state = load_state(workdir)
  model = build_model(config.model)
  prompt = np.frombuffer(config.sample.prompt.encode(), np.uint8).astype(np.int32)[None]
  sampler = make_generator(model, config.sample.max_new_tokens,
                         temperature=config.sample.temperature, top_k=config.sample.top_k)
  tokens = sampler(state["params"], jnp.asarray(prompt), jax.random.PRNGKey(config.sample.seed))
  text = decode(np.asarray(tokens[0]))
  print(f"--- sample ({config.sample.max_new_tokens} bytes after {config.sample.prompt!r}) ---")
  print(text)
  print("---")
  bpb = summary.get("eval", {}).get("bits_per_byte")
  return {"sample": text, "val_bits_per_byte": bpb}
