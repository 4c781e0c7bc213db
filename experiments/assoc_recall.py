"""Associative recall vs context length: a GPT with attention against the same GPT with a
selective state-space mixer (model.mixer='ssm') at about the same parameter count.

Run:
  jaxdl train assoc_recall              # P = 2, 4, 8 x {attention, ssm}: 11 min on 2 cores
  jaxdl train assoc_recall:attn         # attention only (assoc_recall:ssm: the SSM only)
  jaxdl train assoc_recall:smoke        # P = 4, 10 steps each, for tests

Setup: `assoc_recall` data with `fused=True`: keys 0..7, values 8..15, each of the P pairs written
as one token (k, v) (vocabulary 8 + 8 + 64), then Q = 8 queries, each one of the row's keys;
20,000 training rows, 1,000 eval rows, scored only at the queries (task `lm`, its data's
loss_mask selecting the queries; chance 1/8). GPT d 64, 2 layers, 4 heads, RoPE, block_size
P + Q; the SSM variant replaces each block's attention by `jaxdl.models.ssm` with expand 1,
state N = 8 and its width-4 causal conv, which gives it about the parameters of attention
(108,672 vs 105,216 in all, `gpt_costs`). AdamW 3e-3
(decay 0.1), batch 32, warmup then cosine, 1,500 steps per run, seed 0. The experiment's own run
is P = 8 with the first mixer, in <workdir>; its after_training
(`jaxdl.course.studies.recall_sweep`) trains the others into <workdir>/P<P>_<mixer> (before issue
24 every run was a subdirectory; same configs) and writes results.json (eval accuracy at the
queries, eval loss, parameter count).

Expected (measured on the shared 2-core CPU, seed 0; eval accuracy at the queries, eval loss):

  P pairs (T = P + 8)      2                 4                 8
  attention              1.000 (0.0001)    1.000 (0.0002)    1.000 (0.0003)
  ssm                    0.839 (0.338)     0.195 (1.949)     0.246 (1.902)

The course's claim, measured: attention recalls exactly at every length (one hop: the query's
key matches the fused token that holds it), while the SSM at the same budget already misses 16%
at P = 2 and falls to near chance (0.125) from P = 4: its fixed state (E x N = 64 x 8 per layer)
is a linear memory that must hold every pair seen so far, where attention keeps all of them.
Pilots with the unfused task (key and value as two tokens: recall then needs an induction head,
two hops) left attention on its ln P plateau for thousands of steps on this CPU (0.30 at P = 4
after 2,500 steps) and are why the task is fused here; with keys 32 and values 16, fused,
attention took 3,000 steps to leave the ln 16 plateau (0.48 at P = 8 after 6,000) while the SSM
stayed at chance.
"""

from jaxdl.config import base_config, parse_arg, smoke
from jaxdl.course import studies
from jaxdl.data import default_data_config
from jaxdl.models import model_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, attn=False, ssm=False)
  c = base_config()
  c.name, c.task = "assoc_recall", "lm"
  c.description = "Associative recall vs context length: attention vs a selective SSM"
  c.data = default_data_config("assoc_recall")
  c.data.update(queries=8, keys=8, values=8, batch_size=32, fused=True, pairs=8)
  c.mixers = ("attention",) if args.attn else ("ssm",) if args.ssm else ("attention", "ssm")
  c.model = model_config("gpt", vocab_size=8 + 8 + 8 * 8, block_size=8 + 8, n_layer=2,
                         d_model=64, pos="rope", ssm_state=8, ssm_expand=1, mixer=c.mixers[0])
  c.optim = default_optim_config("adamw", lr=3e-3, weight_decay=0.1)
  c.train.update(steps=1500, eval_every=500, log_every=50, ckpt_every=1500, plot=False)
  c.pairs = (2, 4, 8)
  if args.smoke:
    c.data.update(n=256, n_eval=64, pairs=4)
    c.model.block_size = 4 + 8
    c.pairs = (4,)
    smoke(c, steps=10, eval_every=5, ckpt_every=10)
  return c


def after_training(config, workdir, summary):
  """The other (pairs, mixer) runs: accuracy at the queries, loss, parameters (results.json)."""
  return studies.recall_sweep(config, workdir, summary)
