"""`jaxdl export WORKDIR --out DIR`: a trained GPT run as a Hugging Face directory.

  jaxdl export runs/finetune_lora-rank=8 --out my_model_hf
  jaxdl export runs/bpe_gpt --out bpe_gpt_hf --model-type llama --max-shard-bytes 50000000

The run's latest parameters (its moving average when it kept one, unless `--no-ema`), with any
LoRA adapters folded into the base weights first, W' = W + (alpha / r) A B
(`jaxdl.models.lora.merge`), written by `jaxdl.models.hf.save_hf`: config.json and safetensors
weights (sharded past `--max-shard-bytes`) that `transformers` loads, in the layout
`--model-type` names (default: gpt2 for learned positions, llama otherwise, qwen2 with q/k/v
biases). When the run trained on prepared data whose folder holds the tokenizer
(`data.path/tokenizer.json`), that file is copied beside the weights.

Bad input is one line, exit 2, with nothing written: a workdir without a run, a run whose model
is not the GPT, a GPT the chosen layout cannot hold (the field is named), an --out that already
exists or cannot be written.
"""

from __future__ import annotations

import pathlib
import shutil

HELP = "write a trained GPT run (LoRA adapters merged) as a Hugging Face directory"


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--out", required=True, help="the Hugging Face directory to create")
  parser.add_argument("--model-type", default=None, choices=("llama", "mistral", "qwen2", "gpt2"),
                      help="the layout to write (default: from the model's settings)")
  parser.add_argument("--max-shard-bytes", type=int, default=None,
                      help="split the weights into shards of at most this many bytes")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="export the last parameters rather than the run's average")


def main(args) -> None:
  from jaxdl import disk_errors
  from jaxdl.schema import ConfigError
  workdir, out = pathlib.Path(args.workdir), pathlib.Path(args.out)
  if not (workdir / "config.json").is_file():
    raise ConfigError(f"{workdir}: no trained run here (no config.json)")
  if out.exists():
    raise ConfigError(f"--out {out}: already exists; export into a new directory")
  if args.max_shard_bytes is not None and args.max_shard_bytes < 1:
    raise ConfigError(f"--max-shard-bytes: must be >= 1, got {args.max_shard_bytes}")
  problem = disk_errors.unwritable_dir(str(out), "--out")
  if problem:
    raise ConfigError(problem)
  from jaxdl.models import hf, lora
  from jaxdl.models.gpt import GPT
  from jaxdl.train import load_run
  config, model, variables, step = load_run(workdir, ema=args.ema)
  if not isinstance(model, GPT):
    raise ConfigError(f"{workdir}: model {config.model.get('name')!r} is not the GPT; only a "
                      f"GPT run exports to a Hugging Face directory")
  model, params = lora.merge(model, variables["params"])
  staging = out.with_name(out.name + ".partial")
  shutil.rmtree(staging, ignore_errors=True)
  try:
    files = hf.save_hf(str(staging), model, params, model_type=args.model_type,
                       max_shard_bytes=args.max_shard_bytes)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  tokenizer = pathlib.Path(str(config.data.get("path") or ""), "tokenizer.json")
  if config.data.get("path") and tokenizer.is_file():
    shutil.copy(tokenizer, staging / "tokenizer.json")
  staging.rename(out)  # whole or not at all: a failed export leaves no half-written directory
  names = ", ".join(pathlib.Path(f).name for f in files)
  print(f"exported {workdir} (step {step}) to {out}: {names}")
