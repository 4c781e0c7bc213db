"""`jaxdl data`: turn a user's files into prepared ArrayRecord data.

  jaxdl data tokenizer my_texts/ --vocab 4096 --out prepared/   # BPE on the train split
  jaxdl data prepare my_texts/ --out prepared/ --tokenizer bpe   # -> shards + manifest.json
  jaxdl data prepare my_images/ --out prepared_images/           # root/<class>/*.png|jpg
  jaxdl data prepare chat.jsonl --tokenizer DIR --out prepared_chat/  # prompt/response pairs
  jaxdl train bpe_gpt --set data.path=prepared/

SRC is a folder of text files, a .parquet file (a text column), an image folder or a .jsonl file
of instruction records (prompt/response pairs or chat messages, templated with a loss mask that
is zero on the prompt: `jaxdl.data.chat`); the split rule and the output are in
`jaxdl.data.prepare` and `jaxdl.data.records`, the image folders' in `jaxdl.data.images`.
`tokenizer` and `prepare` read SRC and split it with one function, so given the same flags they
accept and refuse the same inputs; `prepare` refuses a tokenizer trained on another split of SRC,
or (OUT's own tokenizer.json) on other files. OUT is written whole or not at all
(`jaxdl.data.staging`): an OUT prepared from another source or with another tokenizer is refused
(`--force` replaces its data whole), and a full disk leaves it as it was. Errors are one line
naming the flag to change (--val-frac, --shard-size, --out, ...; a bad instruction record: its
file and line), raised as `jaxdl.schema.ConfigError` (exit code 2).
"""

from __future__ import annotations

import os

from jaxdl import disk_errors

HELP = ("prepare a folder of text files, a Parquet file, an image folder or chat JSONL "
        "(ArrayRecord)")


def _source_args(p) -> None:
  p.add_argument("src", help="a folder of text files, a .parquet file, root/<class>/*.png, or "
                              "a .jsonl file of prompt/response or messages records")
  p.add_argument("--out", required=True, help="the prepared directory")
  p.add_argument("--pattern", default="*.txt", help="text files to read (default *.txt)")
  p.add_argument("--column", default="text", help="the text column of a .parquet SRC")
  p.add_argument("--max-bytes", type=int, default=0, help="read at most this many bytes")
  p.add_argument("--val-frac", type=float, default=0.1,
                 help="share of files (rows) held out: crc32(name) / 2^32 < val_frac")
  p.add_argument("--force", action="store_true",
                 help="replace OUT's data whole when it was prepared from another source or "
                      "with another tokenizer (without it, such an OUT is refused)")


def add_arguments(parser) -> None:
  sub = parser.add_subparsers(dest="data_command", required=True)
  prep = sub.add_parser("prepare", help="SRC -> ArrayRecord shards + manifest.json")
  _source_args(prep)
  prep.add_argument("--tokenizer", default=None,
                    help="text: bytes | bpe (OUT/tokenizer.json) | a tokenizer.json path | a "
                         "model directory holding one (a Hugging Face model to fine-tune) "
                         "(default: bpe when OUT has a tokenizer.json, else bytes)")
  prep.add_argument("--chat-template", default="auto",
                    help="chat JSONL: auto (the tokenizer directory's Jinja chat_template when "
                         "it has one, else plain) | plain | a Jinja template file")
  prep.add_argument("--mode", default="", choices=["", "L", "RGB"],
                    help="images: convert every image to this mode")
  prep.add_argument("--shard-size", type=int, default=4096, help="records per shard")
  tok = sub.add_parser("tokenizer", help="train a byte-level BPE on SRC's train split")
  _source_args(tok)
  tok.add_argument("--vocab", type=int, default=4096, help="vocabulary size")


def check(args) -> None:
  """Every argument checked before the work starts (one-line ConfigError): --val-frac,
  --max-bytes, --vocab, --shard-size, a readable SRC, a writable --out. (What OUT already holds
  is checked by the library before it reads SRC: `jaxdl.data.staging.check_out`.)"""
  from jaxdl.data import prepare, tokenize
  from jaxdl.schema import ConfigError
  if not 0 < args.val_frac < 1:
    raise ConfigError(f"--val-frac: must be in (0, 1), got {args.val_frac}")
  if args.max_bytes < 0:
    raise ConfigError(f"--max-bytes: must be >= 0 (0 reads everything), got {args.max_bytes}")
  if args.data_command == "tokenizer":
    tokenize.check_vocab_size(args.vocab)
  else:
    prepare.check_shard_size(args.shard_size)
  prepare.check_source(args.src)
  problem = disk_errors.unwritable_dir(args.out, "--out")
  if problem:
    raise ConfigError(problem)


def run(args) -> dict:
  """The command's work; returns the manifest (prepare) or a summary (tokenizer)."""
  from jaxdl.data import chat, images, prepare
  text = dict(pattern=args.pattern, max_bytes=args.max_bytes, column=args.column,
              val_frac=args.val_frac)
  if args.data_command == "tokenizer":
    if chat.is_chat_file(args.src):
      raise ValueError(f"SRC: {args.src!r} is instruction data; train the tokenizer on text (or "
                       "use the base model's) and pass it to `jaxdl data prepare --tokenizer`")
    tok = prepare.train_tokenizer(args.src, args.out, vocab=args.vocab, force=args.force, **text)
    return {"tokenizer": os.path.join(args.out, "tokenizer.json"), "vocab_size": tok.vocab_size}
  if os.path.isdir(args.src) and _is_image_folder(args.src):
    return images.prepare_images(args.src, args.out, val_frac=args.val_frac, mode=args.mode,
                                 shard_size=args.shard_size, force=args.force)
  tokenizer = args.tokenizer or ("bpe" if os.path.isfile(os.path.join(args.out, "tokenizer.json"))
                                 else "bytes")
  if chat.is_chat_file(args.src):
    return chat.prepare_chat(args.src, args.out, tokenizer=tokenizer, val_frac=args.val_frac,
                             shard_size=args.shard_size, chat_template=args.chat_template,
                             force=args.force)
  return prepare.prepare_text(args.src, args.out, tokenizer=tokenizer,
                              shard_size=args.shard_size, force=args.force, **text)


def _is_image_folder(src: str) -> bool:
  from jaxdl.data.images import SUFFIXES
  for d in os.listdir(src):
    sub = os.path.join(src, d)
    if os.path.isdir(sub) and any(f.lower().endswith(SUFFIXES) for f in os.listdir(sub)):
      return True
  return False


def main(args) -> None:
  from jaxdl.schema import ConfigError
  from jaxdl.train import workdir
  check(args)
  # Locked like a workdir: a second `jaxdl data` writing the same --out is refused in one line
  # instead of interleaving its files with this one's.
  with workdir.lock(args.out, expect_config=workdir.read_config(args.out), flag="--out"):
    try:
      result = run(args)
    except OSError as e:  # the output is written whole or not at all (jaxdl.data.staging)
      failure = disk_errors.disk_failure(e, args.out)
      if failure is None:
        raise
      raise ConfigError(f"--out {args.out}: {failure}; nothing was written (the partial "
                        "output is removed)") from e
  if args.data_command == "tokenizer":
    print(f"tokenizer: {result['vocab_size']} ids -> {result['tokenizer']}")
    return
  counts = ", ".join(f"{s} {v['count']}" for s, v in result["splits"].items())
  print(f"prepared {args.out}: {result['kind']} ({counts} examples)")
