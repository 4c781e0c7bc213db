"""A tokenizer's Jinja `chat_template` applied to instruction records, with an exact loss mask.

`jaxdl data prepare chat.jsonl --tokenizer DIR --chat-template auto|plain|FILE`:

  auto   the template of the tokenizer's directory (the folder holding its tokenizer.json: DIR,
         the folder of a tokenizer.json path, OUT for 'bpe') when it has one, else plain:
         DIR/chat_template.jinja (newer transformers save it there, and it wins), else
         tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"}
         of which "default" is used)
  plain  jaxdl's documented default (`jaxdl.data.chat`), bit for bit what it was before
  FILE   a Jinja template file; bos/eos still come from the tokenizer directory, if any

Rendering is transformers' `apply_chat_template`'s: a sandboxed Jinja environment
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the loopcontrols extension, its
`tojson` filter), with `messages` ([{"role", "content"}, ...]), `bos_token` / `eos_token` from
tokenizer_config.json (a string or an {"content": ...} token; left undefined when absent),
`tools` = `documents` = None, `add_generation_prompt` = False and `raise_exception(msg)`.
`strftime_now` is not provided (templates that date their system prompt then use their fixed
fallback), so prepared data does not depend on the day it was made; `{% generation %}` blocks
are not supported (the mask comes from the rule below instead).

Tokens: the whole rendered text is tokenized at once, as transformers' `apply_chat_template(...,
tokenize=True)` tokenizes it: the `tokenizers` Tokenizer's encode of the full string with the
special tokens of the template recognized ('<|im_start|>' becomes its id) and no post-processor
(add_special_tokens=False: no BOS added but the template's own), so the ids are transformers'
(also with sentencepiece-style Metaspace tokenizers, whose '▁' would otherwise be added again at
each boundary of separately tokenized pieces).

The mask comes from the encoding's character offsets. With r_i the rendering of messages[:i]
(r_0 = ""), turn i's text is r_{i+1} minus its prefix r_i; a template for which r_i is not a
prefix of r_{i+1} (one that rewrites earlier turns when a later one arrives: a system prompt
moved into the last user turn, a turn closed differently when it is the last) is refused in one
line naming it, as no token could then be assigned to one turn. Within a turn, the template's own
text is told apart from the message's content by rendering messages[:i] + [turn i with its
content replaced by a marker]: the text before the marker is the turn's head (e.g.
'<|im_start|>assistant\\n'), the text after it the foot ('<|im_end|>\\n'), and turn i's text
must be head + C + foot, C being the content as the template writes it (trimmed, say) — else
refused. A character has m = 1 on an assistant turn's C and foot (the foot ends the turn: a
model fine-tuned without it never learns to stop), 0 on everything else (heads, bos, system and
user turns); a token has m = 1 iff one of the characters it was read from has m = 1 (a token
that a BPE merged across a boundary, Metaspace's '▁Hello' holding the space of the head
'assistant ' and the reply's first word, is scored: the model must write it to give the reply;
a zero-width token takes its position's character's m).

A special token read from a message's text ('<|im_end|>' typed by a user: its characters overlap
a content C) would end a turn the template did not end: the record is refused in one line naming
its file:line and the token, rather than silently parsed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import numpy as np

from jaxdl.data.tokenize import Tokenizer

CONFIG = "tokenizer_config.json"
JINJA = "chat_template.jinja"
# Stands in for a message's content to find where the template writes it: private-use
# characters, which no case change or trim alters.
MARKER = "\ue000\ue001\ue002"


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A Jinja chat template: `name` is the manifest's "template" ('tokenizer' or the file's
  name), `where` names it in errors."""
  name: str
  where: str
  text: str
  specials: tuple[tuple[str, str], ...] = ()  # (bos_token / eos_token, its text)

  @property
  def sha256(self) -> str:
    return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

  @functools.cached_property
  def compiled(self):
    env = _environment()
    import jinja2  # pylint: disable=g-import-not-at-top -- loaded by _environment
    try:
      return env.from_string(self.text)
    except jinja2.TemplateSyntaxError as e:
      raise ValueError(f"--chat-template: {self.where} is not a valid Jinja template "
                       f"(line {e.lineno}: {e.message})") from None

  def render(self, messages: list[tuple[str, str]], record: int,
             add_generation_prompt: bool = False) -> str:
    try:
      return self.compiled.render(
          messages=[{"role": r, "content": c} for r, c in messages], tools=None,
          documents=None, add_generation_prompt=add_generation_prompt, **dict(self.specials))
    except Exception as e:  # noqa: BLE001 -- a user's template can raise anything
      why = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ValueError(f"--chat-template: {self.where} raised on record {record}: {why}") from None


def _environment():
  """transformers' sandboxed environment (module docstring); jinja2 is imported only here."""
  try:
    import jinja2  # pylint: disable=g-import-not-at-top
    from jinja2 import ext, sandbox  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError("--chat-template: applying a Jinja chat template needs jinja2: pip install "
                     "jinja2 (or jaxdl[chat]), or pass --chat-template plain") from None

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=[ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  return env


def tokenizer_dir(tokenizer: str, out_dir: str) -> str | None:
  """The folder holding the tokenizer's tokenizer.json (None for bytes)."""
  spec = os.path.expanduser(tokenizer)
  if spec == "bpe":
    return out_dir
  if spec.endswith(".json"):
    return os.path.dirname(os.path.abspath(spec))
  return spec if os.path.isdir(spec) else None


def _config(folder: str | None) -> tuple[dict, str]:
  """(tokenizer_config.json of `folder` or {}, its path)."""
  path = os.path.join(folder or "", CONFIG)
  if folder is None or not os.path.isfile(path):
    return {}, path
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"--tokenizer: cannot read {path!r} as JSON: {e}") from None
  if not isinstance(config, dict):
    raise ValueError(f"--tokenizer: {path!r} must hold a JSON object")
  return config, path


def _specials(config: dict) -> tuple[tuple[str, str], ...]:
  out = []
  for key in ("bos_token", "eos_token"):
    value = config.get(key)
    if isinstance(value, dict):
      value = value.get("content")
    if isinstance(value, str):
      out.append((key, value))
  return tuple(out)


def resolve(choice: str, tokenizer: str, out_dir: str) -> ChatTemplate | None:
  """The template `--chat-template choice` means (module docstring); None is plain. Compiled
  here, so a template that does not parse is refused before anything is written."""
  folder = tokenizer_dir(tokenizer, out_dir)
  if choice == "plain":
    return None
  config, config_path = _config(folder)
  if choice == "auto":
    jinja_path = os.path.join(folder or "", JINJA)
    if folder is not None and os.path.isfile(jinja_path):
      with open(jinja_path, encoding="utf-8") as f:
        template = ChatTemplate("tokenizer", repr(jinja_path), f.read(), _specials(config))
    else:
      text = config.get("chat_template")
      if text is None:
        return None
      if isinstance(text, list):  # named templates: transformers uses "default"
        text = next((t.get("template") for t in text
                     if isinstance(t, dict) and t.get("name") == "default"), None)
      if not isinstance(text, str):
        raise ValueError(f"--chat-template: {config_path!r} has no usable chat_template (a "
                         f"string, or a list holding one named 'default'); pass --chat-template "
                         f"plain or a template FILE")
      where = f"the chat_template of {config_path!r}"
      template = ChatTemplate("tokenizer", where, text, _specials(config))
  else:
    path = os.path.expanduser(choice)
    if not os.path.isfile(path):
      raise ValueError(f"--chat-template: expected auto, plain or a Jinja template file, got "
                       f"{choice!r}")
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
    except (OSError, UnicodeDecodeError) as e:
      raise ValueError(f"--chat-template: cannot read {choice!r} as text: {e}") from None
    template = ChatTemplate(os.path.basename(path), f"template {choice!r}", text,
                            _specials(config))
  template.compiled  # pylint: disable=pointless-statement -- compile now: fail before writing
  return template


def manifest_entry(template: ChatTemplate | None) -> dict:
  """The manifest's loss_mask keys naming the template (plain: as before, no hash)."""
  if template is None:
    return {"template": "plain"}
  return {"template": template.name, "template_sha256": template.sha256}


def turns(template: ChatTemplate, messages: list[tuple[str, str]],
          record: int) -> tuple[str, list[tuple[int, int, int]]]:
  """(the rendered conversation, [(c0, c1, f1), ...] one a message): message i's content as the
  template writes it is text[c0:c1], the text that ends its turn (its foot) text[c1:f1], its head
  the text before c0 since the previous turn's f1 (module docstring). `record` (1-based) names
  it in errors."""
  out: list[tuple[int, int, int]] = []
  prev = ""
  for i, (role, content) in enumerate(messages):
    full = template.render(messages[:i + 1], record)
    probe = template.render(messages[:i] + [(role, MARKER)], record)
    if not full.startswith(prev) or not probe.startswith(prev):
      raise ValueError(f"--chat-template: {template.where} does not render conversations prefix "
                       f"by prefix (record {record}: rendering messages[:{i + 1}] does not start "
                       f"with the rendering of messages[:{i}]), so no token can be assigned to "
                       f"one turn; pass --chat-template plain or a template FILE that does")
    turn, marked = full[len(prev):], probe[len(prev):]
    if marked.count(MARKER) != 1:
      raise ValueError(f"--chat-template: {template.where} writes message {i}'s content "
                       f"{marked.count(MARKER)} times, expected once (record {record}, role "
                       f"{role!r}), so its turn cannot be told apart; pass --chat-template plain "
                       f"or a template FILE that does")
    head, foot = marked.split(MARKER)
    if (len(turn) < len(head) + len(foot) or not turn.startswith(head)
        or not turn.endswith(foot)):
      raise ValueError(f"--chat-template: {template.where} writes the text around message {i}'s "
                       f"content differently for different contents (record {record}), so the "
                       f"content cannot be told apart from the template's text")
    out.append((len(prev) + len(head), len(full) - len(foot), len(full)))
    prev = full
  return prev, out


def _encode(tok: Tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
  """(ids_N, offsets_Nx2) of the whole `text` as transformers tokenizes a rendered chat: special
  tokens recognized, no post-processor (add_special_tokens=False); offsets are the characters
  [start, end) each token came from. Bytes: one token a byte, each of its character's."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:  # the one-line error Tokenizer.encode_batch gives
    raise ValueError(f"text: not UTF-8 text ({e.reason} at character {e.start}, "
                     f"{text[e.start]!r})") from None
  if tok.hf is None:
    ids = tok.encode(text)
    char_N = np.repeat(np.arange(len(text)), [len(c.encode("utf-8")) for c in text])
    return ids, np.stack([char_N, char_N + 1], 1).reshape(-1, 2)
  tok.hf.encode_special_tokens = False
  try:
    enc = tok.hf.encode(text, add_special_tokens=False)
  finally:
    tok.hf.encode_special_tokens = True  # the pipeline's setting (jaxdl.data.tokenize._wrap)
  return np.asarray(enc.ids, np.int32), np.asarray(enc.offsets, np.int64).reshape(-1, 2)


def _refuse_specials(tok: Tokenizer, text: str, ids_N, offsets_Nx2, contents, at: str) -> None:
  """A special token read from a message's text (the token's own text, its characters overlapping
  a content span [c0, c1) of `contents`, whose k-th is named 'message k') is refused in one line:
  the whole-string encode would take '<|im_end|>' typed by a user for the template's own. An
  unknown character read as '<unk>' is not its text, so not refused."""
  if tok.hf is None:
    return
  special = {i: t.content for i, t in tok.hf.get_added_tokens_decoder().items() if t.special}
  for i, (s, e) in zip(ids_N.tolist(), offsets_Nx2.tolist()):
    if special.get(i) != text[s:e]:  # not read as a special token's text ('<unk>' of '0' is not)
      continue
    for k, (c0, c1) in enumerate(contents):
      if s < c1 and c0 < e:
        raise ValueError(f"{at}: message {k} holds {text[s:e]!r}, a special token of the "
                         f"tokenizer: the rendered chat is tokenized whole, as transformers does, "
                         f"so it would be read as that token, not as text; remove it")


def _token_mask(offsets_Nx2, mask_C) -> np.ndarray:
  """m_N of tokens from m_C of characters: 1 iff the token's characters [s, e) hold one of mask
  1 (a zero-width token: the character at s)."""
  cum = np.concatenate([[0], np.cumsum(mask_C, dtype=np.int64)])
  s, e = offsets_Nx2[:, 0], offsets_Nx2[:, 1]
  e = np.minimum(np.maximum(e, s + 1), len(mask_C))
  return (cum[e] - cum[np.minimum(s, e)] > 0).astype(np.uint8)


def encode(template: ChatTemplate, messages: list[tuple[str, str]], tok: Tokenizer,
           record: int, at: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(ids_N int32, mask_N uint8) of one conversation rendered by `template`, tokenized whole
  (module docstring); `at` names the record in the refusal of a special token in a message
  (default 'record N')."""
  text, spans = turns(template, messages, record)
  ids_N, offsets_Nx2 = _encode(tok, text)
  _refuse_specials(tok, text, ids_N, offsets_Nx2, [(c0, c1) for c0, c1, _ in spans],
                   at or f"record {record}")
  mask_C = np.zeros(len(text), np.uint8)
  for (role, _), (c0, _, f1) in zip(messages, spans):
    mask_C[c0:f1] = role == "assistant"
  return ids_N.astype(np.int32), _token_mask(offsets_Nx2, mask_C)


def encode_prompt(template: ChatTemplate, text: str, tok: Tokenizer,
                  at: str = "--prompt") -> np.ndarray:
  """The ids a chat model continues for one user message `text`: the template's rendering of
  [user: text] with add_generation_prompt (the assistant's head, e.g. '<|im_start|>assistant'),
  tokenized whole as `encode` does and as transformers' apply_chat_template(...,
  add_generation_prompt=True, tokenize=True) does; a special token's text in `text` is refused
  (`at` names the prompt) (`jaxdl generate --chat`)."""
  full = template.render([("user", text)], 1, add_generation_prompt=True)
  marked = template.render([("user", MARKER)], 1, add_generation_prompt=True)
  if marked.count(MARKER) != 1:
    raise ValueError(f"--chat: {template.where} does not write the user's message once")
  head, foot = marked.split(MARKER)
  if not (full.startswith(head) and full.endswith(foot)):
    raise ValueError(f"--chat: {template.where} rewrites the user's message")
  ids_N, offsets_Nx2 = _encode(tok, full)
  _refuse_specials(tok, full, ids_N, offsets_Nx2, [(len(head), len(full) - len(foot))], at)
  return ids_N.astype(np.int32)


def end_of_turn_id(template: ChatTemplate, tok: Tokenizer) -> int | None:
  """The id that ends an assistant turn: the first token of the text the template writes after
  an assistant message ('<|im_end|>', '<|eot_id|>'), when it is a special token of the
  tokenizer; else None (a reply then ends at the tokenizer's end of sequence only)."""
  if tok.hf is None:
    return None
  try:
    marked = template.render([("user", "x"), ("assistant", MARKER)], 1)
  except ValueError:
    return None
  if marked.count(MARKER) != 1:
    return None
  foot, _ = _encode(tok, marked.split(MARKER)[1])
  special = {i for i, t in tok.hf.get_added_tokens_decoder().items() if t.special}
  return int(foot[0]) if len(foot) and int(foot[0]) in special else None
