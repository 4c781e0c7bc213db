"""Multi-run studies: one experiment trained over a grid of variants, each run measured.

A study experiment's own config trains its main run through the engine (`jaxdl train NAME`);
its `after_training` hands that run to one of these procedures, which trains every other variant
of the grid into <workdir>/<variant> and writes <workdir>/results.json. The main run is never
trained twice: it is the variant whose overrides leave the config as it is, measured in
<workdir> itself, and it is reported under its variant name even when the grid omits it.

  train_variants   the procedure: config + {name: dotted overrides} -> {name: measurements}
  depth_sweep      GNN accuracy and embedding spread (MAD) per depth (gnn_depth)
  bottleneck_sweep seq2seq accuracy per string length, with and without attention
                   (seq2seq_reverse); greedy decoding beside teacher forcing
  recall_sweep     associative recall per number of pairs and sequence mixer (assoc_recall)
  layernorm_study  pre-LN vs post-LN: gradient norms per block at init, then training with and
                   without warmup at one peak lr (prepost_ln)

The variants run through the sweep's one scheduler (`jaxdl.sweep.scheduler`), in this process.
A variant whose loss turns non-finite is recorded as {'diverged': True, 'error': ...} and the
study goes on. Rerunning a finished study trains nothing: every run resumes at its last step.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import time
from typing import Callable

import jax
import ml_collections
import numpy as np

from jaxdl.config import variant_config
from jaxdl.stop_signals import Stopped

Measure = Callable[[ml_collections.ConfigDict, str, dict], dict]


def train_variants(config, workdir: str, summary: dict, variants: dict[str, dict],
                   measure: Measure, *, main: str, extra: dict | None = None) -> dict:
  """Trains and measures every variant of `config`; returns and writes {name: measurements}.

  The variants run through the sweep's scheduler (`jaxdl.sweep.scheduler`), one after another in
  this process: a variant that fails (a non-finite loss) is recorded and the study goes on; a
  stop signal stops the study after the variant it stopped saved its step (a rerun resumes it).

  Args:
    config: the study's config, already trained into `workdir` (its summary `summary`).
    variants: {name: dotted overrides} in report order; a variant equal to `config` is the main
      run (not trained again), the others train into <workdir>/<name>.
    measure: (variant config, its directory, its summary) -> dict of numbers.
    main: the main run's variant name, used when no variant equals `config`.
    extra: measurements of the whole study, written first in results.json.
  """
  from jaxdl.stop_signals import Preemption
  from jaxdl.sweep import scheduler
  from jaxdl.sweep.slots import make_slots
  from jaxdl.train import NonFiniteLossError, run
  configs = {name: variant_config(config, o) for name, o in variants.items()}
  if not any(c.to_dict() == config.to_dict() for c in configs.values()):
    configs = {main: config, **configs}
  index = {"runs": {name: {"workdir": _directory(config, workdir, c, name), "log": os.devnull,
                           "seconds": 0.0} for name, c in configs.items()}}
  source = _Variants(configs, index, measure)
  with Preemption() as preempt, preempt.polled():

    def launch(pairs):
      (name, _), = pairs  # one slot: one variant at a time
      c, directory = configs[name], index["runs"][name]["workdir"]
      train = ((lambda: summary) if directory == workdir else
               (lambda: run(c, directory, progress=False)))
      proc = scheduler.InProcess(train, preempt, failures=NonFiniteLossError)
      return [scheduler.Active(name, proc, None, time.monotonic())]

    ended = scheduler.execute(pathlib.Path(workdir), None, index, source, make_slots(1),
                              preempt, print, launch=launch)
  if ended != "done":
    raise Stopped(ended, f"study stopped by {ended}; its runs saved their current step (rerun the "
                  "same command to resume)")
  results = {**(extra or {}), **{name: source.results[name] for name in configs}}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  return results


def _directory(config, workdir: str, variant, name: str) -> str:
  """Where a variant trains: the study's workdir for the variant equal to its config."""
  return workdir if variant.to_dict() == config.to_dict() else os.path.join(workdir, name)


class _Variants:
  """A study's variants as the scheduler's source: a queue; each measured when it finished,
  recorded {'diverged': True, 'error': ...} when it failed."""

  def __init__(self, configs: dict, index: dict, measure: Measure):
    self.configs, self.index, self.measure = configs, index, measure
    self.queue = collections.deque(configs)
    self.results: dict[str, dict] = {}

  def take(self) -> str | None:
    return self.queue.popleft() if self.queue else None

  def done(self) -> bool:
    return not self.queue

  def started(self, run) -> None:
    del run

  def watch(self, run) -> bool:
    del run
    return False

  def retry(self, name: str) -> None:
    self.queue.appendleft(name)

  def ended(self, run, status: str, error: str | None) -> None:
    from jaxdl.sweep import index as jindex
    if status == jindex.FINISHED:
      directory = self.index["runs"][run.name]["workdir"]
      self.results[run.name] = self.measure(self.configs[run.name], directory, run.proc.summary)
    elif status == jindex.FAILED:
      self.results[run.name] = {"diverged": True, "error": error}
    else:
      return  # stopped: the study stops (`train_variants` raises)
    print(f"{run.name}: {self.results[run.name]}", flush=True)


def _params(directory: str):
  from jaxdl.train import load_state
  return load_state(directory)[1]["params"]


# --- over-smoothing with depth -----------------------------------------------------------------

def embedding_spread(config, params=None) -> float:
  """MAD (mean cosine distance) of the last GNN layer's node embeddings on the config's eval
  graph under `params` (None: a fresh init with `config.seed`); 0 when all point one way."""
  from jaxdl.data import parse_data
  from jaxdl.models import build_model
  from jaxdl.models.gnn import Graph, mean_average_distance
  graph = Graph.from_batch(parse_data(config.data).build().eval.gather(np.zeros(1, np.int64)))
  model = build_model(config.model)
  if params is None:
    params = model.init(jax.random.PRNGKey(config.seed), graph, train=False)["params"]
  _, state = model.apply({"params": params}, graph, train=False, mutable=["intermediates"])
  return float(mean_average_distance(state["intermediates"]["embeddings"][0],
                                     graph.node_mask[0]))


def depth_sweep(config, workdir: str, summary: dict) -> dict:
  """The GNN of `config` at each depth L of `config.depths` (<workdir>/depth_<L>): eval
  accuracy, final train loss, and MAD at init and after training."""

  def measure(c, directory, s):
    return {"eval_accuracy": s["eval"]["accuracy"], "train_loss": s["train"]["loss"],
            "mad_init": embedding_spread(c), "mad_trained": embedding_spread(c, _params(directory))}

  return train_variants(config, workdir, summary,
                        {f"depth_{L}": {"model.num_layers": L} for L in config.depths}, measure,
                        main=f"depth_{config.model.num_layers}")


# --- the encoder-decoder bottleneck ------------------------------------------------------------

def greedy_accuracy(config, params) -> dict:
  """Per-digit and whole-string accuracy of greedy decoding (the decoder fed its own previous
  outputs) on the config's eval strings under `params`."""
  from jaxdl.data import parse_data
  from jaxdl.data.digit_strings import START
  from jaxdl.models import build_model
  from jaxdl.models.seq2seq import greedy_decode
  split = parse_data(config.data).build().eval
  batch = split.gather(np.arange(split.num))
  model = build_model(config.model)
  y = np.asarray(greedy_decode(model, {"params": params}, batch["x"][:, :config.model.src_len],
                               START))
  correct = y == batch["y"]
  return {"greedy_accuracy": float(correct.mean()),
          "greedy_exact": float(correct.all(axis=1).mean())}


def _s2s_name(length: int, attention: bool) -> str:
  return f"len{length}_{'attention' if attention else 'plain'}"


def bottleneck_sweep(config, workdir: str, summary: dict) -> dict:
  """The seq2seq model of `config` at each string length S of `config.lengths`, with and
  without attention (<workdir>/len<S>_<attention|plain>): teacher-forced eval accuracy and
  loss, and greedy decoding's accuracy."""

  def measure(c, directory, s):
    return {"eval_accuracy": s["eval"]["accuracy"], "eval_loss": s["eval"]["loss"],
            **greedy_accuracy(c, _params(directory))}

  variants = {_s2s_name(S, a): {"data.length": S, "model.src_len": S, "model.attention": a}
              for S in config.lengths for a in (True, False)}
  return train_variants(config, workdir, summary, variants, measure,
                        main=_s2s_name(config.data.length, config.model.attention))


# --- associative recall ------------------------------------------------------------------------

def recall_sweep(config, workdir: str, summary: dict) -> dict:
  """The GPT of `config` at each number of pairs P of `config.pairs` and each sequence mixer of
  `config.mixers` (<workdir>/P<P>_<mixer>; block size P + queries): eval accuracy at the
  queries, eval loss and parameter count."""
  from jaxdl.models import build_model
  from jaxdl.models.costs import gpt_costs

  def measure(c, directory, s):
    return {"eval_accuracy": s["eval"]["accuracy"], "eval_loss": s["eval"]["loss"],
            "params": gpt_costs(build_model(c.model))["params"]}

  q = config.data.queries
  variants = {f"P{P}_{m}": {"data.pairs": P, "model.block_size": P + q, "model.mixer": m}
              for P in config.pairs for m in config.mixers}
  return train_variants(config, workdir, summary, variants, measure,
                        main=f"P{config.data.pairs}_{config.model.mixer}")


# --- layer-norm placement and warmup -----------------------------------------------------------

def layernorm_variants(warmup_frac: float) -> dict[str, dict]:
  """{pre|post}_{no_warmup|warmup}: the block layout and the warmup fraction (0 or
  `warmup_frac`), everything else, the peak lr included, as in the study's config."""
  return {f"{ln}_{'warmup' if w else 'no_warmup'}": {"model.ln": ln,
                                                       "optim.schedule.warmup_frac": w}
          for ln in ("pre", "post") for w in (0.0, warmup_frac)}


def layernorm_study(config, workdir: str, summary: dict) -> dict:
  """Gradient norm of each GPT block at init, pre- and post-LN, on `config.model`'s sizes, then
  the four runs of `layernorm_variants(config.warmup_frac)`: eval loss, last train loss."""
  from jaxdl.course.measure import block_grad_norms
  from jaxdl.train.writers import read_metrics
  m = config.model
  sizes = dict(n_layer=m.n_layer, d_model=m.d_model, n_head=m.n_head, vocab=m.vocab_size,
               seq=m.block_size, init=m.init_name, seed=config.seed)
  grads = {ln: [round(float(g), 4) for g in block_grad_norms(ln, **sizes)]
           for ln in ("pre", "post")}
  extra = {"grad_norms_at_init": grads,
           "post_over_pre": [round(b / a, 3) for a, b in zip(grads["pre"], grads["post"])]}

  def measure(c, directory, s):
    losses = [r["loss"] for r in read_metrics(directory, "train")]
    return {"diverged": False, "eval_loss": s["eval"]["loss"],
            "train_loss_last": losses[-1] if losses else None}

  return train_variants(config, workdir, summary, layernorm_variants(config.warmup_frac),
                        measure, extra=extra,
                        main=f"{m.ln}_warmup{config.optim.schedule.warmup_frac}")
