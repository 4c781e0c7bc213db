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

The mask: with r_i the rendering of messages[:i] (r_0 = ""), turn i's text is r_{i+1} minus its
prefix r_i; a template for which r_i is not a prefix of r_{i+1} (one that rewrites earlier turns
when a later one arrives: a system prompt moved into the last user turn, a turn closed
differently when it is the last) is refused in one line naming it, as no token could then be
assigned to one turn. Within a turn, the template's own text is told apart from the message's
content by rendering messages[:i] + [turn i with its content replaced by a marker]: the text
before the marker is the turn's head (e.g. '<|im_start|>assistant\\n'), the text after it the
foot ('<|im_end|>\\n'), and turn i's text must be head + C + foot, C being the content as the
template writes it (trimmed, say) — else refused. m = 1 on an assistant turn's C and foot (the
foot ends the turn: a model fine-tuned without it never learns to stop), 0 on everything else
(heads, bos, system and user turns).

Tokens: the rendered text is cut at those boundaries and each piece tokenized on its own,
without the tokenizer's post-processor (no BOS added: the template writes its own, as
transformers tokenizes a rendered chat), so ids and mask align exactly and the ids decode back
to the rendered text. The template's text is tokenized with special tokens recognized
('<|im_start|>' becomes its id), a message's content with them as plain text (a user who
writes '<|im_end|>' cannot end a turn). The consequence: BPE merges never cross a piece
boundary, so the ids can differ from tokenizing the whole rendered string at a boundary
(e.g. '\\n' + 'Hello' as two pieces rather than one merge); the text is the same.
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


def pieces(template: ChatTemplate, messages: list[tuple[str, str]],
           record: int) -> list[tuple[str, int, bool]]:
  """[(text, mask, is content), ...] whose texts join to the rendered conversation (module
  docstring); adjacent pieces of one kind are merged. `record` (1-based) names it in errors."""
  out: list[tuple[str, int, bool]] = []
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
    m = int(role == "assistant")
    out += [(head, 0, False), (turn[len(head):len(turn) - len(foot)], m, True), (foot, m, False)]
    prev = full
  merged: list[tuple[str, int, bool]] = []
  for text, m, is_content in out:
    if not text:
      continue
    if merged and merged[-1][1:] == (m, is_content):
      merged[-1] = (merged[-1][0] + text, m, is_content)
    else:
      merged.append((text, m, is_content))
  return merged


def _encode(tok: Tokenizer, texts: list[str], specials: bool) -> list[np.ndarray]:
  """Each text's ids, without the post-processor; special tokens recognized iff `specials`."""
  if tok.hf is None or not texts:
    return tok.encode_batch(texts)
  for t in texts:  # the one-line error Tokenizer.encode_batch gives for a lone surrogate
    try:
      t.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ValueError(f"text: not UTF-8 text ({e.reason} at character {e.start}, "
                       f"{t[e.start]!r})") from None
  tok.hf.encode_special_tokens = not specials
  try:
    return [np.asarray(e.ids, np.int32) for e in tok.hf.encode_batch(texts,
                                                                      add_special_tokens=False)]
  finally:
    tok.hf.encode_special_tokens = True  # the pipeline's setting (jaxdl.data.tokenize._wrap)


def encode(template: ChatTemplate, messages: list[tuple[str, str]], tok: Tokenizer,
           record: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids_N int32, mask_N uint8) of one conversation rendered by `template`: each piece
  tokenized on its own (template text with special tokens, content without), concatenated."""
  parts = pieces(template, messages, record)
  ids = [None] * len(parts)
  for is_content in (False, True):
    idx = [k for k, p in enumerate(parts) if p[2] == is_content]
    for k, e in zip(idx, _encode(tok, [parts[k][0] for k in idx], specials=not is_content)):
      ids[k] = e
  mask_N = np.concatenate([np.full(len(i), p[1], np.uint8) for i, p in zip(ids, parts)])
  return np.concatenate(ids).astype(np.int32), mask_N


def encode_prompt(template: ChatTemplate, text: str, tok: Tokenizer) -> np.ndarray:
  """The ids a chat model continues for one user message `text`: the template's rendering of
  [user: text] with add_generation_prompt (the assistant's head, e.g. '<|im_start|>assistant'),
  the template's text tokenized with special tokens recognized and `text` as plain text
  (`encode`'s rule), no BOS added but the template's own (`jaxdl generate --chat`)."""
  full = template.render([("user", text)], 1, add_generation_prompt=True)
  marked = template.render([("user", MARKER)], 1, add_generation_prompt=True)
  if marked.count(MARKER) != 1:
    raise ValueError(f"--chat: {template.where} does not write the user's message once")
  head, foot = marked.split(MARKER)
  if not (full.startswith(head) and full.endswith(foot)):
    raise ValueError(f"--chat: {template.where} rewrites the user's message")
  content = full[len(head):len(full) - len(foot)]
  h, f = _encode(tok, [head, foot], specials=True)
  (c,) = _encode(tok, [content], specials=False)
  return np.concatenate([h, c, f]).astype(np.int32)


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
  (foot,) = _encode(tok, [marked.split(MARKER)[1]], specials=True)
  special = {i for i, t in tok.hf.get_added_tokens_decoder().items() if t.special}
  return int(foot[0]) if len(foot) and int(foot[0]) in special else None
