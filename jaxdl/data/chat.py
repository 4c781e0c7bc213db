"""Instruction data: JSONL prompt/response pairs or chat messages -> tokens and a loss mask.

Input (`jaxdl data prepare chat.jsonl --tokenizer PATH --out D`), one JSON object a line:

  {"prompt": "...", "response": "..."}                          one exchange
  {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}

a `messages` list holding at least one user and one assistant turn, the last one the
assistant's. Blank lines are skipped. A bad line (not JSON, a missing or empty prompt / response /
content, an unknown role, no assistant turn at the end) is a one-line ValueError naming its line
number (`jaxdl data` exits 2).

Template (`--chat-template`): a tokenizer directory's Jinja `chat_template` when it has one
(`auto`, the default) or a template FILE is rendered as transformers' `apply_chat_template`
renders it, with the mask 1 on each assistant turn's content and the text that ends the turn,
the whole rendered text tokenized as transformers tokenizes it (a record whose message holds a
special token's text, '<|im_end|>', is refused naming its line: `jaxdl.data.chat_template`);
otherwise, and with `--chat-template plain`, the plain default applies: the segments

  system     "### System:\\n{content}\\n\\n"                           mask 0
  user       "### Instruction:\\n{content}\\n\\n### Response:\\n"       mask 0
  assistant  "{content}"                                              mask 1
             "\\n\\n" after an assistant turn that is not the last      mask 0

(a prompt/response pair is one user and one assistant turn). Each segment is tokenized on its
own and the ids concatenated, so the mask is exact at token level: m_i = 1 iff token i belongs to
an assistant's content. The document then ends where packing puts end-of-text: the e that
follows it in the packed stream (`jaxdl.data.packing`) is its closing token, scored too (the
model learns to stop).

Split: record n (its index among the records: 0, 1, ...) goes to val when crc32(str(n)) / 2^32 <
val_frac, or crc32(its `split_key`) when the record carries one (the built-in instruction set
uses the module path, so a module's functions stay on one side); both splits must hold a record.

Prepared format: kind 'lm' with one field `tokens_mask`, shape (-1, 2) and the tokenizer's id
dtype: column 0 the token ids, column 1 the loss mask m (0/1), so a record's ids and mask are one
variable-length array (`jaxdl.data.records` allows one variable length a record); the manifest
adds "loss_mask": {"field": "tokens_mask", "column": 1, "template": "plain"} (a Jinja template:
its name, 'tokenizer' or the file's, and "template_sha256", the sha256 of its text).
"""

from __future__ import annotations

import ast
import json
import os
import zlib

import numpy as np

from jaxdl.data import chat_template as templates
from jaxdl.data import prepare, records, staging
from jaxdl.data.tokenize import Tokenizer, get_tokenizer

FIELD = "tokens_mask"
ROLES = ("system", "user", "assistant")
TEMPLATE = {"system": "### System:\n{}\n\n", "user": "### Instruction:\n{}\n\n### Response:\n",
            "assistant": "{}"}
TURN_GAP = "\n\n"


def _fail(where: str, line: int, why: str):
  raise ValueError(f"SRC: {where} line {line}: {why}")


def _text(obj: dict, key: str, where: str, line: int) -> str:
  value = obj.get(key)
  if not isinstance(value, str):
    got = type(value).__name__ if key in obj else "none"
    _fail(where, line, f"expected a string {key!r}, got {got}")
  if not value.strip():
    _fail(where, line, f"{key!r} is empty")
  try:
    value.encode("utf-8")
  except UnicodeEncodeError as e:  # a JSON escape of half a surrogate pair: "\ud800"
    _fail(where, line, f"{key!r} is not UTF-8 text ({e.reason} at character {e.start}, "
          f"{value[e.start]!r})")
  return value


def record_messages(obj, where: str, line: int) -> list[tuple[str, str]]:
  """[(role, content), ...] of one JSONL record (module docstring), checked."""
  if not isinstance(obj, dict):
    _fail(where, line, f"expected a JSON object, got {type(obj).__name__}")
  if "messages" in obj:
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs:
      _fail(where, line, "'messages' must be a non-empty list of {role, content} objects")
    out = []
    for k, m in enumerate(msgs):
      if not isinstance(m, dict):
        _fail(where, line, f"message {k} is not an object")
      role = m.get("role")
      if role not in ROLES:
        _fail(where, line, f"message {k}: unknown role {role!r}; expected one of "
              f"{', '.join(ROLES)}")
      out.append((role, _text(m, "content", where, line)))
    if out[-1][0] != "assistant":
      _fail(where, line, "the last message must be the assistant's (the response to score)")
    if not any(r == "user" for r, _ in out):
      _fail(where, line, "no user message")
    return out
  if "prompt" not in obj and "response" not in obj:
    _fail(where, line, f"expected 'prompt' and 'response', or 'messages'; got keys "
          f"{sorted(obj)}")
  return [("user", _text(obj, "prompt", where, line)),
          ("assistant", _text(obj, "response", where, line))]


def render(messages: list[tuple[str, str]]) -> list[tuple[str, int]]:
  """The template's (text, mask) segments of one conversation (module docstring)."""
  out = []
  for k, (role, content) in enumerate(messages):
    out.append((TEMPLATE[role].format(content), int(role == "assistant")))
    if role == "assistant" and k + 1 < len(messages):
      out.append((TURN_GAP, 0))
  return out


def prompt_text(prompt: str) -> str:
  """What a model is given to answer `prompt` (the template up to the response)."""
  return TEMPLATE["user"].format(prompt)


def encode(messages: list[tuple[str, str]], tok: Tokenizer,
           template: templates.ChatTemplate | None = None, record: int = 0,
           at: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(ids_N int32, mask_N uint8). `template`: a Jinja template, the rendered text tokenized whole
  (`jaxdl.data.chat_template.encode`; `record`, 1-based, names the record in its errors, `at`
  ('SRC: chat.jsonl:LINE') in the refusal of a special token in a message), or None: the plain
  one, each segment tokenized on its own and concatenated."""
  if template is not None:
    return templates.encode(template, messages, tok, record, at)
  segments = render(messages)
  ids = tok.encode_batch([s for s, _ in segments])
  mask_N = np.concatenate([np.full(len(i), m, np.uint8) for i, (_, m) in zip(ids, segments)])
  return np.concatenate(ids).astype(np.int32), mask_N


def read_jsonl(path: str) -> list[tuple[str, list[tuple[str, str]], int]]:
  """[(split key, messages, line number), ...] of a JSONL file, in order; bad lines are one-line
  errors."""
  where = os.path.basename(path)
  out = []
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.readlines()
  except UnicodeDecodeError as e:
    raise ValueError(f"SRC: {path!r} is not UTF-8 text (byte {e.start}: {e.reason})") from e
  for n, text in enumerate(lines, 1):
    if not text.strip():
      continue
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      _fail(where, n, f"not JSON ({e.msg} at column {e.colno})")
    messages = record_messages(obj, where, n)
    key = obj.get("split_key") if isinstance(obj.get("split_key"), str) else str(len(out))
    out.append((key, messages, n))
  if not out:
    raise ValueError(f"SRC: {path!r} holds no records")
  return out


def is_chat_file(path: str) -> bool:
  return os.path.isfile(path) and path.endswith(".jsonl")


def prepare_chat(src: str, out_dir: str, *, tokenizer: str = "bytes", val_frac: float = 0.1,
                 shard_size: int = 4096, records_: list | None = None,
                 chat_template: str = "plain", force: bool = False) -> dict:
  """Instruction data (a JSONL file `src`, or `records_` = [(split key, messages), ...] already
  read) -> `tokens_mask` records (ids and loss mask, (N, 2)) + lengths + manifest in `out_dir`
  (the manifest). Split by crc32 of each record's split key. Templated by `chat_template` (auto |
  plain | a Jinja file: `jaxdl.data.chat_template`); every record is encoded before anything is
  written, so a template that fails on one leaves no output. The output folder is checked and
  written as `jaxdl.data.prepare.prepare_text`'s (`staging.check_out` unless `force`,
  `staging.staged_output`)."""
  tok = get_tokenizer(tokenizer, out_dir, key="--tokenizer")
  if not force:
    staging.check_out(out_dir, src, tok, tokenizer)
  template = templates.resolve(chat_template, tokenizer, out_dir)
  recs = read_jsonl(src) if records_ is None else [(k, m, None) for k, m in records_]
  problem = prepare.split_error(sorted({k for k, _, _ in recs}), val_frac, src, "records")
  if problem:
    raise ValueError(problem.replace("its relative path", "its split key: its index among the "
                                     "records unless it has a 'split_key'"))
  encoded = {"train": [], "val": []}
  for n, (k, m, line) in enumerate(recs, 1):
    at = f"SRC: {os.path.basename(src)}:{line}" if line else f"SRC: record {n}"
    encoded[split_of(k, val_frac)].append(encode(m, tok, template, n, at))
  dtype = "uint16" if tok.vocab_size <= 2**16 else "int32"
  fields = {FIELD: {"shape": [-1, 2], "dtype": dtype}}
  splits = {}
  with staging.staged_output(out_dir, tok) as stage:
    for split, enc in encoded.items():
      np.save(os.path.join(stage, f"{split}.lengths.npy"), np.array([len(i) for i, _ in enc]))
      splits[split] = prepare.write_split(
          stage, split, ({FIELD: np.stack([i, m], 1)} for i, m in enc), len(enc), fields,
          shard_size, f"{split} records", tok)
      splits[split]["tokens"] = int(sum(len(i) for i, _ in enc))
      splits[split]["response_tokens"] = int(sum(m.sum() for _, m in enc))
    return records.write_manifest(stage, {
        "kind": "lm", "fields": fields, "splits": splits, "source": os.path.abspath(src),
        "tokenizer": prepare.tokenizer_entry(tok),
        "loss_mask": {"field": FIELD, "column": 1, **templates.manifest_entry(template)}})


# ---------------------------------------------------------------------------------------------
# The built-in instruction set: the standard library's docstrings -> its function signatures.


def signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
  """The `def` line of a function, as `ast.unparse` writes it: 'def name(args) -> ret:'."""
  ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
  kw = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
  return f"{kw} {node.name}({ast.unparse(node.args)}){ret}:"


def stdlib_instructions(root: str, max_records: int, max_line: int = 200) -> list[dict]:
  """{"prompt": a docstring's first line, "response": the function's `def` line, "split_key":
  the module's path relative to `root`} for every documented function of the .py files under
  `root` (sorted by path, then `ast.walk` order), until `max_records`. Deterministic; functions
  whose docstring line or signature is longer than `max_line` characters, or whose file does not
  parse, are skipped."""
  out = []
  for rel in prepare.walk(root, "*.py"):
    try:
      with open(os.path.join(root, rel), "rb") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, ValueError, OSError):
      continue
    for node in ast.walk(tree):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      doc = ast.get_docstring(node)
      first = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
      if not first or len(first) > max_line:
        continue
      sig = signature(node)
      if len(sig) > max_line:
        continue
      out.append({"prompt": first, "response": sig, "split_key": rel})
      if len(out) >= max_records:
        return out
  return out


def split_of(key: str, val_frac: float) -> str:
  return "val" if zlib.crc32(key.encode()) / 2**32 < val_frac else "train"
