"""`jaxdl generate DIR --prompt TEXT [--prompt TEXT ...]`: continue text with a language model.

  jaxdl generate path/to/hf_model --prompt "Once upon a time" --max-new-tokens 40
  jaxdl generate runs/char_gpt --prompt "ROMEO:" --prompt "JULIET:" --temperature 0.8 --top-k 20
  jaxdl generate path/to/chat_model --chat --prompt "Name a prime." --temperature 0

DIR is a Hugging Face Llama, Mistral, Qwen, Gemma or GPT-2 directory (`jaxdl.models.hf`, with the
tokenizer.json beside its weights) or the workdir of a jaxdl 'lm' run (its latest checkpoint, the
parameter average when it kept one; the tokenizer its data was prepared with, or bytes for a
256-token byte model). Every prompt is continued `--num` times (default 1), all in one batch:
prompts of different lengths are left-padded, each row's positions counted from its own first
token and the padding masked (`jaxdl.models.decoding.make_generator`), so a row continues as it
would alone. Tokens are drawn with `--temperature` (0: greedy), `--top-k` and `--top-p`; a row
ends at an end-of-sequence id: a Hugging Face directory's (generation_config.json, else
config.json, else tokenizer_config.json's eos_token: `jaxdl.models.hf.special_ids`; none there,
none: it runs to --max-new-tokens as transformers' generate does), a run's the end-of-text id
of its tokenizer, and with --chat also the template's end of turn (`<|im_end|>`, `<|eot_id|>`:
`jaxdl.data.chat_template.end_of_turn_id`). Prints one line per row, prompt by prompt, the
prompt's text and its continuation (end of sequence and padding dropped).

`--chat` wraps each prompt as one user message in the tokenizer's chat template with the
assistant's turn opened and the whole text tokenized as transformers' apply_chat_template(...,
add_generation_prompt=True) tokenizes it, a prompt holding a special token's text refused
(`jaxdl.data.chat_template.encode_prompt`): the template of a Hugging Face
directory (chat_template.jinja or tokenizer_config.json's chat_template); of a run, the one its
chats were rendered with (from its prepared data folder or its Hugging Face base, `init_from`:
what its export carries); where there is none it is refused in one line. With --chat only the
reply is printed.

Every option is checked, top-k against the model's vocabulary and each prompt against its
context, before the weights are read: one line, exit 2.
"""

from __future__ import annotations

import json
import os

HELP = "continue a --prompt with a Hugging Face model directory or a trained 'lm' run"


def add_arguments(parser) -> None:
  parser.add_argument("model", metavar="DIR",
                      help="a Hugging Face model directory or the workdir of an 'lm' run")
  parser.add_argument("--prompt", required=True, action="append",
                      help="the text to continue (repeat for a batch)")
  parser.add_argument("--chat", action="store_true",
                      help="apply the tokenizer's chat template (the prompt as a user message)")
  parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to add (default 32)")
  parser.add_argument("--num", type=int, default=1,
                      help="continuations of each prompt (default 1)")
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
  """(tokenizer, its folder or None) of an 'lm' run: the tokenizer its prepared data names (the
  data folder), else bytes for a 256-token model; anything else is refused in one line."""
  from jaxdl.data import parse_data
  from jaxdl.data.tokenize import bytes_tokenizer, get_tokenizer
  from jaxdl.schema import ConfigError
  data = parse_data(config.data)
  if hasattr(data, "directory"):
    directory = data.directory()
    manifest = os.path.join(directory, "manifest.json")
    if os.path.isfile(manifest):
      with open(manifest, encoding="utf-8") as f:
        return get_tokenizer(json.load(f)["tokenizer"]["name"], directory), directory
  if config.model.vocab_size == 256:
    return bytes_tokenizer(), None
  raise ConfigError(f"{workdir}: cannot tell the run's tokenizer (its prepared data is not "
                    f"there and its vocab_size is {config.model.vocab_size}, not 256 bytes)")


def chat_template_of(kind: str, cfg, folder: str | None):
  """The chat template --chat renders with: a Hugging Face directory's (`folder`); a run's, the
  one its data was rendered with, from the data folder or its Hugging Face base
  (`jaxdl.cli.export.run_chat_template`, what its export carries); None where there is none."""
  import pathlib
  from jaxdl.cli.export import run_chat_template
  from jaxdl.data import chat_template
  if folder is None:
    return None
  if kind == "hf":
    return chat_template.resolve("auto", folder, folder)
  return run_chat_template(cfg, pathlib.Path(folder))[0]


def prompt_ids(args, tok, template, eos: list) -> tuple[list, list]:
  """(each --prompt's ids, the end-of-sequence ids): its text tokenized and `eos`; or with --chat
  the rendering of it by `template` (`chat_template_of`) and `eos` with the template's end of
  turn."""
  from jaxdl.data import chat_template
  from jaxdl.schema import ConfigError
  if not args.chat:
    rows = tok.encode_batch(args.prompt)
  else:
    template = template if tok.hf is not None else None
    if template is None:
      raise ConfigError(f"--chat: {args.model} has no chat template (no chat_template.jinja or "
                        f"tokenizer_config.json chat_template beside its tokenizer, nor in a "
                        f"run's base; a run's data in jaxdl's plain template has none)")
    rows = [chat_template.encode_prompt(template, text, tok, at=f"--prompt: prompt {i + 1}")
            for i, text in enumerate(args.prompt)]
    turn_end = chat_template.end_of_turn_id(template, tok)
    if turn_end is not None:
      eos = [*eos, turn_end]
  for i, ids in enumerate(rows):
    if not len(ids):
      raise ConfigError(f"--prompt: prompt {i + 1} encodes to no tokens")
  return rows, eos


def load(args):
  """(model, params, tokenizer, prompt id rows, eos ids, pad id) for `args`, every option checked
  before the weights are read (module docstring)."""
  from jaxdl.models import build_model, decoding, hf
  from jaxdl.schema import ConfigError
  for flag, value in (("--num", args.num), ("--max-new-tokens", args.max_new_tokens)):
    if value < 1:
      raise ConfigError(f"{flag}: must be >= 1, got {value}")
  kind, cfg = read_model_config(args.model)
  model = (hf.model_from_config(cfg, args.model) if kind == "hf" else
           build_model(cfg.model))
  decoding.check_sampling(model.vocab_size, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, names=("--temperature", "--top-k", "--top-p"))
  if kind == "hf":
    from jaxdl.data.tokenize import load_hf_tokenizer
    tok, folder = load_hf_tokenizer(args.model, model.vocab_size, key=args.model), args.model
    specials = hf.special_ids(args.model, tok.hf.token_to_id)
  else:
    tok, folder = run_tokenizer(cfg, args.model)
    specials = {"eos": [tok.eot_id], "pad": None}
  template = chat_template_of(kind, cfg, folder) if args.chat else None
  rows, eos = prompt_ids(args, tok, template, specials["eos"])
  longest = max(len(r) for r in rows)
  if longest >= model.block_size:
    raise ConfigError(f"--prompt: {longest} tokens fill the model's context of "
                      f"{model.block_size}; nothing is left to generate")
  if longest + args.max_new_tokens > model.block_size:
    raise ConfigError(f"--max-new-tokens: {longest} prompt tokens + {args.max_new_tokens} "
                      f"exceed the model's context of {model.block_size}")
  if getattr(model, "mixer", None) not in (None, "attention") and len({len(r) for r in rows}) > 1:
    raise ConfigError(f"--prompt: prompts of different lengths are left-padded, which "
                      f"model.mixer={model.mixer!r} cannot mask; give prompts of one length")
  eos = [e for e in eos if 0 <= e < model.vocab_size]
  pad = next((i for i in (specials["pad"], *eos) if i is not None), 0)
  if kind == "hf":
    model, params = hf.load_hf(args.model)
  else:
    from jaxdl.train import load_run
    _, model, variables, _ = load_run(args.model, cfg, ema=args.ema)
    params = variables["params"]
  return model, params, tok, rows, eos, pad


def continuations(out_BxN, start_B, p: int, eos) -> list:
  """Each row's ids without its left padding, cut before its first end of sequence after the
  prompt's P ids (the prompt is kept whole)."""
  import numpy as np
  rows = []
  for row, s in zip(np.asarray(out_BxN), np.asarray(start_B)):
    new = row[p:]
    ends = np.flatnonzero(np.isin(new, list(eos)))
    rows.append((row[s:p], new[:ends[0]] if len(ends) else new))
  return rows


def main(args) -> None:
  import jax
  import numpy as np
  from jaxdl.models import decoding
  from jaxdl.schema import ConfigError
  try:
    model, params, tok, rows, eos, pad = load(args)
  except ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:  # a tokenizer or weights that do not fit
    raise ConfigError(str(e).splitlines()[0]) from None
  prompt_BxP, start_B = decoding.left_pad([r for r in rows for _ in range(args.num)], pad)
  out_BxN = decoding.generate(model, params, prompt_BxP, jax.random.key(args.seed),
                              args.max_new_tokens, start_B=start_B if start_B.any() else None,
                              temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, eos_ids=eos, pad_id=pad)
  for prompt, new in continuations(out_BxN, start_B, prompt_BxP.shape[1], eos):
    print(tok.decode(new) if args.chat else tok.decode(np.concatenate([prompt, new])))
