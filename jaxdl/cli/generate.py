"""`jaxdl generate DIR --prompt TEXT`: continue text with a language model.

  jaxdl generate path/to/hf_model --prompt "Once upon a time" --max-new-tokens 40
  jaxdl generate runs/char_gpt --prompt "ROMEO:" --temperature 0.8 --top-k 20 --num 3

DIR is a Hugging Face Llama / Mistral / Qwen2 / GPT-2 directory (`jaxdl.models.hf`, with the
tokenizer.json beside its weights) or the workdir of a jaxdl 'lm' run (its latest checkpoint, the
parameter average when it kept one; the tokenizer its data was prepared with, or bytes for a
256-token byte model). Prints `--num` continuations (default 1), one per line, drawn with
`--temperature` (0: greedy), `--top-k` and `--top-p` (`jaxdl.models.decoding.make_generator`).
Every option is checked, top-k against the model's vocabulary, before the weights are read.
"""

from __future__ import annotations

import json
import os

HELP = "continue a --prompt with a Hugging Face model directory or a trained 'lm' run"


def add_arguments(parser) -> None:
  parser.add_argument("model", metavar="DIR",
                      help="a Hugging Face model directory or the workdir of an 'lm' run")
  parser.add_argument("--prompt", required=True, help="the text to continue")
  parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to add (default 32)")
  parser.add_argument("--num", type=int, default=1, help="continuations to draw (default 1)")
  parser.add_argument("--temperature", type=float, default=1.0,
                      help="softmax temperature (0: the likeliest token each step)")
  parser.add_argument("--top-k", type=int, default=0,
                      help="keep the k likeliest tokens, 1..vocab (0: all)")
  parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1: all)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="an 'lm' run: its last parameters even if it kept an average")


def read_model_config(directory: str):
  """('hf', its config.json dict) or ('run', the run's ConfigDict) of DIR, refusing anything
  else in one line; reads config.json only."""
  import ml_collections
  from jaxdl.models import hf
  from jaxdl.schema import ConfigError
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise ConfigError(f"{directory}: no config.json (expected a Hugging Face model directory or "
                      "the workdir of an 'lm' run)")
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e})".splitlines()[0]) from None
  if isinstance(raw, dict) and "task" in raw:
    if raw["task"] != "lm":
      raise ConfigError(f"{directory}: a {raw['task']!r} run continues no text; `jaxdl generate` "
                        "needs an 'lm' run (`jaxdl sample` draws from generative runs)")
    return "run", ml_collections.ConfigDict(raw)
  return "hf", hf.read_config(directory)


def run_tokenizer(config, workdir: str):
  """The tokenizer of an 'lm' run: the one its prepared data names, else bytes for a 256-token
  model; anything else is refused in one line."""
  from jaxdl.data import parse_data
  from jaxdl.data.tokenize import bytes_tokenizer, get_tokenizer
  from jaxdl.schema import ConfigError
  data = parse_data(config.data)
  if hasattr(data, "directory"):
    directory = data.directory()
    manifest = os.path.join(directory, "manifest.json")
    if os.path.isfile(manifest):
      with open(manifest, encoding="utf-8") as f:
        return get_tokenizer(json.load(f)["tokenizer"]["name"], directory)
  if config.model.vocab_size == 256:
    return bytes_tokenizer()
  raise ConfigError(f"{workdir}: cannot tell the run's tokenizer (its prepared data is not "
                    f"there and its vocab_size is {config.model.vocab_size}, not 256 bytes)")


def load(args):
  """(model, params, tokenizer, prompt ids) for `args`, every option checked before the weights
  are read (module docstring)."""
  from jaxdl.models import build_model, decoding, hf, hf_families
  from jaxdl.schema import ConfigError
  for flag, value in (("--num", args.num), ("--max-new-tokens", args.max_new_tokens)):
    if value < 1:
      raise ConfigError(f"{flag}: must be >= 1, got {value}")
  kind, cfg = read_model_config(args.model)
  model = (hf_families.model_from_config(cfg, args.model) if kind == "hf" else
           build_model(cfg.model))
  decoding.check_sampling(model.vocab_size, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, names=("--temperature", "--top-k", "--top-p"))
  if kind == "hf":
    from jaxdl.data.tokenize import load_hf_tokenizer
    tok = load_hf_tokenizer(args.model, model.vocab_size, key=args.model)
  else:
    tok = run_tokenizer(cfg, args.model)
  ids = tok.encode(args.prompt)
  if not len(ids):
    raise ConfigError("--prompt: encodes to no tokens")
  if len(ids) + args.max_new_tokens > model.block_size:
    raise ConfigError(f"--max-new-tokens: {len(ids)} prompt tokens + {args.max_new_tokens} "
                      f"exceed the model's context of {model.block_size}")
  if kind == "hf":
    model, params = hf.load_hf(args.model)
  else:
    from jaxdl.train import load_run
    _, model, variables, _ = load_run(args.model, cfg, ema=args.ema)
    params = variables["params"]
  return model, params, tok, ids


def main(args) -> None:
  import jax
  import numpy as np
  from jaxdl.models import decoding
  from jaxdl.schema import ConfigError
  try:
    model, params, tok, ids = load(args)
  except ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:  # a tokenizer or weights that do not fit
    raise ConfigError(str(e).splitlines()[0]) from None
  prompt_BxP = np.tile(np.asarray(ids, np.int32)[None], (args.num, 1))
  out_BxN = decoding.generate(model, params, prompt_BxP, jax.random.key(args.seed),
                              args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p)
  for row in np.asarray(out_BxN):
    print(tok.decode(row))
