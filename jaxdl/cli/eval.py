"""`jaxdl eval DIR --text FILE | --data PREPARED | --choices FILE.jsonl`: score a language model.

  jaxdl eval path/to/hf_model --text held_out.txt
  jaxdl eval runs/bpe_gpt --data data/tiny_bpe
  jaxdl eval path/to/hf_model --choices questions.jsonl

DIR is a Hugging Face model directory (its tokenizer.json) or the workdir of a jaxdl 'lm' run
(the tokenizer its data was prepared with, or bytes), as for `jaxdl generate`.
  --text FILE         the file's UTF-8 text as one stream: loss (nats/token), perplexity and bits
                      per byte, in windows of the model's context moved by --stride (default half
                      the context; the rule is `jaxdl.train.scoring`'s docstring)
  --data PREPARED     the val split of `jaxdl data prepare` output made with the model's
                      tokenizer, its documents one stream, each after an end-of-text token;
                      bits per byte over the split's bytes. Instruction data (chat.jsonl, a
                      loss mask) scores its responses only, each record alone, as fine-tuning
                      does: tokens, loss and bits per byte of the response tokens (and the
                      end-of-text that closes each)
  --choices FILE      JSON lines {"context": str, "choices": [str, ...], "answer": index}: each
                      choice scored by its summed log-likelihood given the context; accuracy and
                      length-normalized accuracy (acc_norm) as lm-evaluation-harness defines them
Prints `name value` lines. Every input is read and checked (one line naming FILE:LINE) before
the weights are.
"""

from __future__ import annotations

import json
import os

HELP = "perplexity, bits per byte or multiple-choice accuracy of an 'lm' run or HF directory"


def add_arguments(parser) -> None:
  parser.add_argument("model", metavar="DIR",
                      help="a Hugging Face model directory or the workdir of an 'lm' run")
  what = parser.add_mutually_exclusive_group(required=True)
  what.add_argument("--text", metavar="FILE", help="a UTF-8 text file to score")
  what.add_argument("--data", metavar="PREPARED",
                    help="prepared data: its val split (chat data: its responses)")
  what.add_argument("--choices", metavar="FILE", help="multiple-choice items, JSON lines")
  parser.add_argument("--stride", type=int, default=0,
                      help="tokens between window starts, 1..context (default: context / 2)")
  parser.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="an 'lm' run: its last parameters even if it kept an average")


def read_text(path: str) -> str:
  """The UTF-8 text of `path`; ConfigError for a missing, unreadable or empty file."""
  from jaxdl.schema import ConfigError
  if not os.path.isfile(path):
    raise ConfigError(f"--text: {path}: no such file")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"--text: {path}: unreadable ({e})".splitlines()[0]) from None
  if not text:
    raise ConfigError(f"--text: {path}: empty (no text to score)")
  return text


def read_choices(path: str) -> list[dict]:
  """The items of a JSON-lines file (blank lines skipped); ConfigError naming FILE:LINE for a
  line that is not {"context": str, "choices": [str, ...], "answer": int in range}."""
  from jaxdl.schema import ConfigError
  if not os.path.isfile(path):
    raise ConfigError(f"--choices: {path}: no such file")
  items = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"--choices: {path}:{n}"
      try:
        item = json.loads(line)
      except ValueError as e:
        raise ConfigError(f"{where}: not JSON ({e})".splitlines()[0]) from None
      if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected an object with context, choices and answer")
      choices, answer = item.get("choices"), item.get("answer")
      if not isinstance(item.get("context"), str) or not item["context"]:
        raise ConfigError(f"{where}: 'context' must be a non-empty string")
      if (not isinstance(choices, list) or len(choices) < 2 or
          not all(isinstance(a, str) and a for a in choices)):
        raise ConfigError(f"{where}: 'choices' must be a list of at least 2 non-empty strings")
      if isinstance(answer, bool) or not isinstance(answer, int) or not (
          0 <= answer < len(choices)):
        raise ConfigError(f"{where}: 'answer' must be an index 0..{len(choices) - 1} into "
                          f"its {len(choices)} choices, got {answer!r}")
      items.append({"context": item["context"], "choices": choices, "answer": answer})
  if not items:
    raise ConfigError(f"--choices: {path}: no items")
  return items


def read_prepared(path: str, tok, tok_spec: str = "DIR") -> tuple[list, list | None, int]:
  """(the val split's documents as token arrays, their loss masks or None, its UTF-8 bytes) of
  prepared data, refusing data made with another tokenizer than `tok` (the model's, `tok_spec`
  for --tokenizer). Instruction data (a manifest `loss_mask`, `jaxdl.data.chat`) has masks, 1
  on the responses, and its bytes are those of the response tokens (`main` counts them)."""
  from jaxdl.data import records
  from jaxdl.schema import ConfigError
  try:
    manifest = records.read_manifest(path, key="--data")
  except ValueError as e:
    raise ConfigError(str(e).splitlines()[0]) from None
  made_by = (manifest.get("tokenizer") or {}).get("sha256")  # a manifest, not a setting
  if manifest.get("kind") != "lm" or made_by is None:
    raise ConfigError(f"--data: {path} is not tokenized text (expected `jaxdl data prepare` "
                      "text output)")
  if made_by != tok.fingerprint:
    made = manifest["tokenizer"]
    raise ConfigError(f"--data: {path} was tokenized with another tokenizer (sha256 "
                      f"{made_by[:12]}) than the model's ({tok.fingerprint[:12]}): "
                      f"{made.get('name')!r} of {made.get('vocab_size')} ids, not the model's "
                      f"{tok.vocab_size}; prepare it with the model's (`jaxdl data prepare SRC "
                      f"--tokenizer {tok_spec} --out DIR`)")
  split = manifest["splits"]["val"]
  reader = records.RecordReader(os.path.expanduser(path), split, manifest["fields"], "--data")
  mask = manifest.get("loss_mask")
  if mask is None:
    docs = [r["tokens"].astype("int32") for r in reader.get(range(len(reader)))]
    return docs, None, int(split["bytes"])
  field, column = mask["field"], int(mask["column"])
  both = [r[field] for r in reader.get(range(len(reader)))]
  return ([b[:, 1 - column].astype("int32") for b in both],
          [b[:, column].astype("int32") for b in both], 0)


def main(args) -> None:
  import jax
  import numpy as np
  from jaxdl.cli.generate import read_model_config, run_tokenizer
  from jaxdl.models import build_model, hf
  from jaxdl.schema import ConfigError
  from jaxdl.train import scoring
  if args.batch_size < 1:
    raise ConfigError(f"--batch-size: must be >= 1, got {args.batch_size}")
  text = read_text(args.text) if args.text else None
  masks = None  # --data of instruction data: only its responses are scored
  items = read_choices(args.choices) if args.choices else None
  kind, cfg = read_model_config(args.model)
  try:
    if kind == "hf":
      from jaxdl.data.tokenize import load_hf_tokenizer
      model = hf.model_from_config(cfg, args.model)
      tok = load_hf_tokenizer(args.model, model.vocab_size, key=args.model)
      tok_spec = args.model
    else:
      model, (tok, folder) = build_model(cfg.model), run_tokenizer(cfg, args.model)
      tok_spec = folder or "bytes"
    context = model.block_size
    stride = args.stride or max(1, context // 2)
    scoring.windows(2, context, stride)  # checks --stride
    if items is not None:
      requests = scoring.choice_requests(tok, items, context)
    elif text is not None:
      stream, prefixed = scoring.text_stream(tok, tok.encode(text), model.vocab_size)
      n_bytes = len(text.encode("utf-8"))
      if not prefixed:
        n_bytes -= int(tok.token_bytes()[stream[0]])
      if len(stream) < 2:
        raise ConfigError(f"--text: {args.text}: one token, nothing to predict")
    else:
      docs, masks, n_bytes = read_prepared(args.data, tok, tok_spec)
      stream = np.concatenate([np.concatenate([[tok.eot_id], d]) for d in docs]).astype(np.int32)
      if masks is not None:  # the response tokens' bytes (the closing e has none)
        n_bytes = int(sum((tok.token_bytes()[d] * m).sum() for d, m in zip(docs, masks)))
    if kind == "hf":
      model, params = hf.load_hf(args.model)
      variables = {"params": params}
    else:
      from jaxdl.train import load_run
      _, model, variables, _ = load_run(args.model, cfg, ema=args.ema)
  except ValueError as e:  # a tokenizer, input or weights that do not fit
    raise ConfigError(str(e).splitlines()[0]) from None
  if items is None and int(stream.max()) >= model.vocab_size:  # bytes' end of text, 256
    raise ConfigError(f"{args.model}: token id {int(stream.max())} is past the model's "
                      f"{model.vocab_size}-row embedding")
  score = scoring.make_scorer(model, jax.tree.map(jax.numpy.asarray, variables))
  if items is not None:
    reqs, owner = requests
    lls = -scoring.sum_nll(score, reqs, context, args.batch_size)
    out = scoring.choice_scores(lls, owner, items)
    print(f"items {out['items']}\nacc {out['acc']:.4f}\nacc_norm {out['acc_norm']:.4f}")
    return
  if masks is None:
    nll, tokens = scoring.score_stream(score, stream, context, stride, args.batch_size)
  else:
    nll, tokens = scoring.score_responses(score, docs, masks, tok.eot_id, context, stride,
                                          args.batch_size)
  out = scoring.text_metrics(nll, tokens, n_bytes)
  print(f"tokens {out['tokens']}\nloss {out['loss']:.6f}\nperplexity {out['perplexity']:.6f}\n"
        f"bits_per_byte {out['bits_per_byte']:.6f}")
