"""`jaxdl export WORKDIR --out DIR`: a trained GPT run as a Hugging Face directory.

  jaxdl export runs/finetune_lora-rank=8 --out my_model_hf
  jaxdl export runs/bpe_gpt --out bpe_gpt_hf --model-type llama --max-shard-bytes 50000000

The run's latest parameters (its moving average when it kept one, unless `--no-ema`), with any
LoRA adapters folded into the base weights first, W' = W + (alpha / r) A B
(`jaxdl.models.lora.merge`), written by `jaxdl.models.hf.save_hf`: config.json and safetensors
weights (sharded past `--max-shard-bytes`) that `transformers` loads, in the layout
`--model-type` names (default: gpt2 for learned positions, Gemma's for norm='rms1p', qwen3 with
q/k norms, qwen2 with q/k/v biases, phi3 with LongRoPE or partial rotary, mistral with a sliding
window, llama otherwise).

Tokenizer and special tokens, so transformers' `AutoTokenizer` and `generate` stop where the
source did: the bos / eos / pad ids go to config.json and generation_config.json, taken from the
run's base when `init_from` is a Hugging Face directory or a run fine-tuned from one (`hf_base`,
`jaxdl.models.hf.special_ids`: its generation_config.json, config.json, tokenizer_config.json),
else eos = pad = the end-of-text id of the run's tokenizer. When the run trained on prepared data
whose folder holds the tokenizer (`data.path/tokenizer.json`), that file is copied beside the
weights with a tokenizer_config.json naming those special tokens and carrying the chat template,
the base's (chat_template.jinja or tokenizer_config.json beside the base's tokenizer) or else the
data folder's, when there is one; when the data's manifest names the template its chats were
rendered with, only that one (by its sha256; none, with a printed note, for jaxdl's plain
template or one found in neither place).

Bad input is one line, exit 2, with nothing written: a workdir without a run, a run whose model
is not the GPT, a GPT the chosen layout cannot hold (the field is named), an --out that already
exists or cannot be written. The directory is written under a temporary name beside --out and
renamed to it at the end; on any failure the temporary one is removed, so --out is whole or
absent, and a full disk (or a permission error) is one line, exit 2.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

HELP = "write a trained GPT run (LoRA adapters merged) as a Hugging Face directory"


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--out", required=True, help="the Hugging Face directory to create")
  # hf_config.MODEL_TYPES, spelled out: parsing imports no jax (test_hf_phi checks they agree)
  parser.add_argument("--model-type", default=None, choices=(
      "llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gemma", "gemma2", "gemma3_text"),
                      help="the layout to write (default: from the model's settings)")
  parser.add_argument("--max-shard-bytes", type=int, default=None,
                      help="split the weights into shards of at most this many bytes")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="export the last parameters rather than the run's average")


def special_tokens(config, tokenizer: pathlib.Path | None, vocab_size: int):
  """({'bos', 'eos', 'pad'} ids, the tokenizer's id_to_token or None) of an export (module
  docstring); ids outside the model's vocabulary (bytes' end of text, 256, on a 256-id model)
  are dropped."""
  from jaxdl.data.tokenize import load_bpe
  from jaxdl.models import hf
  tok = load_bpe(str(tokenizer)) if tokenizer is not None else None
  base = hf_base(config)
  if base:
    specials = hf.special_ids(base, tok.hf.token_to_id if tok is not None else None)
  else:
    eot = tok.eot_id if tok is not None else 256  # a run without a tokenizer.json is bytes
    specials = {"bos": None, "eos": [eot], "pad": eot}
  specials["pad"] = next((i for i in (specials["pad"], *specials["eos"]) if i is not None), None)
  ok = lambda i: i is not None and 0 <= i < vocab_size  # noqa: E731
  specials = {"bos": specials["bos"] if ok(specials["bos"]) else None,
              "eos": [i for i in specials["eos"] if ok(i)],
              "pad": specials["pad"] if ok(specials["pad"]) else None}
  return specials, tok.hf.id_to_token if tok is not None else None


def hf_base(config) -> str:
  """The Hugging Face directory the run descends from, else '': its `init_from` when that is
  one, or, when `init_from` is a jaxdl run, that run's own (and so on), so a run fine-tuned from
  a fine-tuned run keeps the first base's special tokens and chat template."""
  seen = set()
  base = os.path.expanduser(str(config.get("init_from") or ""))
  while base and base not in seen and os.path.isfile(os.path.join(base, "config.json")):
    if not os.path.isdir(os.path.join(base, "checkpoints")):
      return base
    seen.add(base)
    try:  # a jaxdl run: its own init_from (a relative one read from here, as ours is)
      with open(os.path.join(base, "config.json"), encoding="utf-8") as f:
        base = os.path.expanduser(str(json.load(f).get("init_from") or ""))
    except (OSError, ValueError, AttributeError):
      return ""
  return ""


def run_chat_template(config, data_dir: pathlib.Path):
  """(the chat template a run speaks, a `jaxdl.data.chat_template.ChatTemplate`, or None; a note
  saying why none, or None): what an export carries and `jaxdl generate RUN --chat` renders. The
  candidates are the base's (a Hugging Face `init_from`) and the data folder's
  (`jaxdl.data.chat_template.resolve` 'auto'). When the run's prepared data names the template
  it was rendered with (its manifest's loss_mask), only that one, found by its sha256: the model
  learned that format; data rendered with jaxdl's plain template, or with a template neither
  holds, has none."""
  from jaxdl.data import chat_template
  base = hf_base(config)
  candidates = [t for t in (chat_template.resolve("auto", d, d) for d in (base, str(data_dir))
                            if d and os.path.isdir(d)) if t is not None]
  manifest = data_dir / "manifest.json"
  mask = json.loads(manifest.read_text()).get("loss_mask") if manifest.is_file() else None
  if not isinstance(mask, dict) or "template" not in mask:
    return (candidates[0] if candidates else None), None
  if mask["template"] == "plain":
    return None, "no chat_template: the run's data used jaxdl's plain template"
  want = mask.get("template_sha256")
  match = next((t for t in candidates if t.sha256 == want), None)
  if match is None:
    return None, (f"no chat_template: the run's data used template {mask['template']!r} "
                  f"(sha256 {str(want)[:12]}), which neither the base nor the data folder holds")
  return match, None


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
  hf.export_type(model, args.model_type)  # refused before anything is written
  tokenizer = pathlib.Path(str(config.data.get("path") or ""), "tokenizer.json")
  if not (config.data.get("path") and tokenizer.is_file()):
    tokenizer = None
  try:
    specials, id_to_token = special_tokens(config, tokenizer, model.vocab_size)
    template, note = (run_chat_template(config, tokenizer.parent) if tokenizer is not None
                      else (None, None))
  except ValueError as e:
    raise ConfigError(str(e).splitlines()[0]) from None
  # The first folder this export creates: removed whole on failure, so a missing parent of
  # --out that it made is not left behind either.
  created = out.absolute()
  while not created.parent.exists():
    created = created.parent
  staging = out.with_name(f".{out.name}.{os.getpid()}.partial")
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    files = hf.save_hf(str(staging), model, params, model_type=args.model_type,
                       max_shard_bytes=args.max_shard_bytes, specials=specials)
    if tokenizer is not None:
      hf.save_tokenizer(str(staging), str(tokenizer), specials, id_to_token,
                        model_max_length=model.block_size,
                        chat_template=template.text if template is not None else None)
    staging.rename(out)  # whole or not at all
  except BaseException as e:
    shutil.rmtree(staging if created == out.absolute() else created, ignore_errors=True)
    failure = disk_errors.disk_failure(e)
    if failure is not None:
      # A full disk is refused like any output that cannot be written (exit 2): the export
      # changed nothing, and the same command succeeds once there is room.
      raise ConfigError(f"export: {failure} (nothing written to --out {out})") from e
    raise
  if note:
    print(f"export: {note}")
  names = ", ".join(pathlib.Path(f).name for f in files)
  print(f"exported {workdir} (step {step}) to {out}: {names}")
