"""Instruction fine-tuning of a trained GPT: full fine-tuning against LoRA at two ranks.

Run (the base first, then the three fine-tunings of it):
  jaxdl train bpe_gpt                                   # the base: runs/bpe_gpt
  jaxdl train finetune_lora:full                        # every parameter trains
  jaxdl train finetune_lora:rank=8                      # LoRA r 8 (also `finetune_lora:lora8`)
  jaxdl train finetune_lora:rank=2                      # LoRA r 2 (also `finetune_lora:lora2`)
  jaxdl train finetune_lora --set init_from=DIR         # another base: a jaxdl workdir or a
                                                        # Hugging Face model folder
  jaxdl train finetune_lora --set init_from=DIR --set data.path=D
                                                        # your data: `jaxdl data prepare
                                                        # chat.jsonl --tokenizer DIR --out D`
  jaxdl train finetune_lora:smoke                       # a random tiny base, bytes, seconds

The base's architecture, and the tokenizer the default data is prepared with, come from
`init_from` (`jaxdl.train.init_from.resolve`): the model section below is a placeholder that
only `:smoke` without `init_from` trains as it is. Data prepared with another tokenizer than the
base's is refused in one line (exit 2) before the workdir is touched.

Data (`data.name = 'stdlib_instructions'`, `jaxdl.data.chat`, built on first use into the cache
with the base's own tokenizer, nothing downloaded): for every documented function of the Python
standard library's .py files (at most 20000, lines of at most 100 characters), the prompt is the
docstring's first line and the response the function's `def` line, in the plain template

  ### Instruction:\\n{docstring line}\\n\\n### Response:\\n{def line}<|endoftext|>

with the loss mask 1 on the `def` line and its closing end-of-text, 0 on the rest; records are
packed into 64-token windows with segment ids (a record never attends to another; one cut by a
window's start is scored without its prompt in view, the same for every variant). Split: crc32 of
the module path against 0.1, bpe_gpt's own rule, so the held-out responses come from files the
base never trained on: 8,354 pairs, 7,725 train and 629 val.

Fine-tuning: the base's architecture and parameters (`init_from`, `jaxdl.train.init_from`);
full: AdamW 1e-3, LoRA: AdamW 3e-3 on adapters beside every attention and MLP layer
(q, k, v, o, c_fc, c_proj; alpha = 2 r), the base frozen (no gradient, no optimizer state);
both warmup-cosine, batch 32, no weight decay, `steps` steps (default 300), the best checkpoint
by eval loss. Reported: `eval/loss`, the mean CE per held-out response token over the val split
(`jaxdl.train.tasks`: exact over the split), the trainable parameter count, the optimizer-state
bytes (the saved state's arrays) and the median seconds per training step.

Expected: every fine-tuning far below the base's zero-shot loss on the held-out responses, full
fine-tuning lowest, LoRA at rank 8 below rank 2, with LoRA's optimizer state a few percent of full
fine-tuning's. Measured on the 2-core CPU shared with other jobs (load average 5-7), the base
`jaxdl train bpe_gpt` as written (800 steps, val 4.083 nats per token, 1.692 bits per byte; 7.3
CPU-min), then the three commands above (300 steps each, ~3.3 CPU-min each):

  variant     val loss / response token   trainable params   optimizer state   s / step
  base        4.713 (zero-shot: step 0, the same val windows, nothing trained)
  full        2.764                       1,325,824          10,606,592 B      0.94
  LoRA r 8    3.065                       73,728 (5.6%)      589,824 B (5.6%)  0.59
  LoRA r 2    3.145                       18,432 (1.4%)      147,456 B (1.4%)  0.93

(percentages: of full fine-tuning's; AdamW keeps m and v, 8 bytes a trainable parameter.)
(eval losses at steps 100 / 200 / 300: full 2.923 / 2.819 / 2.764, r 8 3.149 / 3.086 / 3.065, r 2
3.220 / 3.157 / 3.145.) The step times are the machine's load more than the method's: at this
size the frozen base still runs its forward and its activations' backward, and LoRA saves only
the weight gradients and AdamW's update of 1.3M parameters. On a base pretrained for 250 steps
only (val 4.868 nats per token) the same runs gave zero-shot 5.169, full 3.041, r 8 3.498, r 2
3.550: the better base helps every variant, LoRA's gap to full fine-tuning shrinks (0.46 -> 0.30).
`finetune_lora:smoke` (4 steps of LoRA r 8 on a random 1-layer d 32 model, bytes, 400 records)
ends at about 5.5 nats per response token (~15 CPU-s with the data and the import of jax).
"""

import json
import os

import jax
import numpy as np

from jaxdl.config import parse_arg, smoke
from jaxdl.course.supervised_configs import stdlib_gpt
from jaxdl.data import default_data_config
from jaxdl.models import lora
from jaxdl.train.checkpoint import load_state

TARGETS = ("attn", "mlp")
BASE = "runs/bpe_gpt"


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, full=False, lora8=False, lora2=False, rank=8, steps=300)
  rank = 0 if args.full else 2 if args.lora2 else 8 if args.lora8 else args.rank
  c = stdlib_gpt("finetune_lora", "Instruction fine-tuning of a trained GPT: full vs LoRA")
  c.data = default_data_config("stdlib_instructions")
  c.data.update(context_length=64, batch_size=32, eval_batch_size=64, max_eval_windows=256,
                segment_ids=True)
  if args.smoke:  # a random tiny base on bytes (unless --set init_from): seconds
    c.data.update(prepare_with="bytes", max_records=400, context_length=32, batch_size=8,
                  eval_batch_size=16, max_eval_windows=16)
    c.model.update(vocab_size=257, d_model=32, n_layer=1, n_head=2, block_size=32,
                   scan_unroll=1)
  else:  # the architecture and the data's tokenizer are the base's when the run is built
    c.init_from = BASE  # refused in one line when training starts if nothing is there
  if rank:
    c.model.update(lora_rank=rank, lora_alpha=2.0 * rank, lora_targets=TARGETS)
  c.optim.update(lr=1e-3 if not rank else 3e-3, weight_decay=0.0)
  c.train.update(steps=args.steps, eval_every=max(1, args.steps // 3), ckpt_every=args.steps)
  return smoke(c, steps=4, eval_every=2, ckpt_every=4) if args.smoke else c


def after_training(config, workdir, summary) -> dict:
  """Trainable parameters, optimizer-state bytes and seconds per step of the run."""
  _, state = load_state(workdir)
  leaves = [(lora.path_str(p), x) for p, x in jax.tree_util.tree_leaves_with_path(state["params"])]
  adapted = config.model.lora_rank > 0
  trainable = sum(int(np.size(x)) for p, x in leaves if lora.is_adapter(p) or not adapted)
  total = sum(int(np.size(x)) for _, x in leaves)
  opt_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(state["opt_state"]) if hasattr(x, "nbytes")
                  and np.ndim(x) > 0)
  out = {"val_loss_per_response_token": summary.get("eval", {}).get("loss"),
         "trainable_params": trainable, "total_params": total, "optimizer_state_bytes": opt_bytes,
         "sec_per_step": _sec_per_step(workdir)}
  print("finetune_lora: " + ", ".join(f"{k} {v}" for k, v in out.items()))
  return out


def _sec_per_step(workdir) -> float | None:
  """The median of the logged steps/s (`jaxdl.train.throughput`: evaluation and checkpoints
  left out), inverted."""
  rates = []
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      for line in f:
        row = json.loads(line)
        rate = row.get("steps_per_s") if row.get("split") == "throughput" else None
        if rate:
          rates.append(float(rate))
  except (OSError, ValueError):
    return None
  return float(1.0 / np.median(rates)) if rates else None
