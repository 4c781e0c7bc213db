"""Tokenizers for language-model text: raw bytes, or byte-level BPE (Hugging Face `tokenizers`).

Both map text to int32 ids and back, and have an end-of-text id `eot_id` that separates packed
documents (`jaxdl.data.packing`):

  bytes  id = the UTF-8 byte (0..255); eot_id = 256, so V = 257.
  bpe    byte-level BPE (GPT-2's scheme): text -> UTF-8 bytes -> merges learned on the training
         split, most frequent pair first, until V ids; '<|endoftext|>' is a special token that
         text never produces (the literal string in a document is encoded as text). Trained by
         `train_bpe` (`jaxdl data tokenizer`) or loaded from any `tokenizer.json` that has
         '<|endoftext|>' (GPT-2's has it, id 50256), or else one of the end-of-text tokens of
         Hugging Face models' tokenizers (`EOT_ALIASES`: '</s>' of Llama 2 / Mistral,
         '<|end_of_text|>' of Llama 3, ...).
  A Hugging Face model directory's tokenizer.json (`load_hf_tokenizer`, or a directory given as
  the tokenizer spec) must have no more ids than the model's vocab_size: config.json's.

`tokenizer.token_bytes()` gives the UTF-8 bytes each id decodes to (0 for end-of-text), so a
language model's loss can be stated per byte of text (`jaxdl.data.packing`).

`tokenizer.fingerprint` is the sha256 of the tokenizer's JSON ('bytes' for bytes); prepared data
records it, so data tokenized by one tokenizer is never read with another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Iterable

import numpy as np

EOT = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """`encode(text) -> int32 ids`, `decode(ids) -> text`; `hf` is the `tokenizers.Tokenizer`
  behind a BPE (None for bytes)."""
  name: str
  vocab_size: int
  eot_id: int
  hf: Any = None

  def encode(self, text: str) -> np.ndarray:
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids. Text never encodes to a special id: '<|endoftext|>' written in a
    document is text like any other (only packing inserts end-of-text). A string that is not
    UTF-8 text (a lone surrogate) is a one-line ValueError."""
    try:
      if self.hf is None:
        return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) for t in texts]
      return [np.asarray(e.ids, np.int32) for e in self.hf.encode_batch(texts)]
    except (UnicodeEncodeError, TypeError):
      for t in texts:
        try:
          t.encode("utf-8")
        except UnicodeEncodeError as e:
          raise ValueError(f"text: not UTF-8 text ({e.reason} at character {e.start}, "
                           f"{t[e.start]!r})") from None
      raise

  def decode(self, ids) -> str:
    """Ids -> text; end-of-text ids are dropped and invalid UTF-8 is replaced."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) != self.eot_id]
    if self.hf is None:
      return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
    return self.hf.decode(ids, skip_special_tokens=True)

  def token_bytes(self) -> np.ndarray:
    """int32 (V,): the UTF-8 bytes id v decodes to; 0 for special tokens (end-of-text).

    bytes: 1 per byte id. Byte-level BPE: a token's string spells one alphabet character per
    byte, so its length is its byte count. Any other tokenizer.json: the bytes of the id
    decoded alone.
    """
    if self.hf is None:
      return np.asarray([1] * 256 + [0], np.int32)
    from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = {t.content for t in self.hf.get_added_tokens_decoder().values() if t.special}
    out_V = np.zeros((self.vocab_size,), np.int32)
    for v in range(self.vocab_size):
      token = self.hf.id_to_token(v)
      if token is None or token in special:
        continue
      out_V[v] = (len(token) if set(token) <= alphabet
                  else len(self.hf.decode([v]).encode("utf-8")))
    return out_V

  @property
  def fingerprint(self) -> str:
    if self.hf is None:
      return "bytes"
    return hashlib.sha256(self.hf.to_str().encode()).hexdigest()

  def save(self, path: str) -> None:
    if self.hf is None:
      raise ValueError("the bytes tokenizer has no tokenizer.json to save")
    self.hf.save(path)


def bytes_tokenizer() -> Tokenizer:
  return Tokenizer("bytes", 257, 256)


# The end-of-text token is the first of these the tokenizer has ('<|endoftext|>' first, so every
# tokenizer that has it keeps it): decided by the tokenizer.json alone, so the copy prepared data
# carries finds the same one.
EOT_ALIASES = (EOT, "</s>", "<|end_of_text|>", "<|im_end|>", "<eos>")


def _wrap(hf, where: str) -> Tokenizer:
  eot = next((i for i in map(hf.token_to_id, EOT_ALIASES) if i is not None), None)
  if eot is None:
    raise ValueError(f"{where}: the tokenizer has none of the end-of-text tokens "
                     f"{', '.join(EOT_ALIASES)} (needed to separate packed documents)")
  # Special tokens are the pipeline's: the literal text of one in a document is encoded as text.
  hf.encode_special_tokens = True
  return Tokenizer("bpe", int(hf.get_vocab_size()), int(eot), hf)


# The largest BPE vocabulary `train_bpe` accepts: 2^20 ids is 20x GPT-2's and more than any
# model here embeds, while a larger request makes the tokenizers library try to allocate for it
# up front and abort the process (measured: --vocab 10^11 is SIGABRT, exit 134).
MAX_VOCAB = 2**20


def check_vocab_size(vocab_size: int) -> None:
  """One-line ValueError naming --vocab unless 257 <= vocab_size <= MAX_VOCAB."""
  if vocab_size < 257:
    raise ValueError(f"--vocab: a byte-level BPE needs at least 257 ids (256 bytes + "
                     f"{EOT}), got {vocab_size}")
  if vocab_size > MAX_VOCAB:
    raise ValueError(f"--vocab: at most {MAX_VOCAB} (2**20) ids, got {vocab_size}")


def train_bpe(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
  """A byte-level BPE with `vocab_size` ids (256 byte symbols + merges + '<|endoftext|>' = id 0),
  trained on `texts`. Deterministic: the same texts give the same merges."""
  from tokenizers import Tokenizer as HF  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers
  check_vocab_size(vocab_size)
  hf = HF(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                special_tokens=[EOT], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(texts, trainer)
  return _wrap(hf, "train_bpe")


def load_bpe(path: str, key: str = "data.tokenizer") -> Tokenizer:
  """A tokenizer from a `tokenizer.json` file; one-line ValueError naming `key` otherwise."""
  from tokenizers import Tokenizer as HF  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise ValueError(f"{key}: tokenizer file not found: {path!r}")
  try:
    hf = HF.from_file(path)
  except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception on bad JSON
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"{key}: cannot read {path!r} as a tokenizer.json: {first}") from e
  return _wrap(hf, f"{key}: {path!r}")


def load_hf_tokenizer(model_dir: str, vocab_size: int | None = None,
                      key: str = "--tokenizer") -> Tokenizer:
  """The tokenizer.json beside a Hugging Face model's weights. Its ids must index the model's
  embedding: at most `vocab_size` (default: config.json's vocab_size) of them, else a one-line
  ValueError naming `key` (a model may have more rows than its tokenizer has ids, never fewer)."""
  path = os.path.join(model_dir, "tokenizer.json")
  if not os.path.isfile(path):
    raise ValueError(f"{key}: {model_dir!r} has no tokenizer.json beside the weights")
  tok = load_bpe(path, key)
  if vocab_size is None:
    try:
      with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        vocab_size = json.load(f).get("vocab_size")
    except (OSError, ValueError):
      vocab_size = None
  if vocab_size is not None and tok.vocab_size > vocab_size:
    raise ValueError(f"{key}: {path!r} has {tok.vocab_size} ids but the model's vocab_size is "
                     f"{vocab_size}: the tokenizer does not match the weights")
  return tok


def get_tokenizer(spec: str, data_dir: str | None = None, key: str = "data.tokenizer"):
  """'bytes'; 'bpe' (the tokenizer.json of the prepared data in `data_dir`); a path to a
  tokenizer.json; or a Hugging Face model directory (`load_hf_tokenizer`)."""
  if spec == "bytes":
    return bytes_tokenizer()
  if spec == "bpe":
    if data_dir is None:
      raise ValueError(f"{key}: 'bpe' means the tokenizer.json of prepared data; set data.path "
                       "to a prepared directory, or give the tokenizer.json path itself")
    return load_bpe(os.path.join(data_dir, "tokenizer.json"), key)
  if spec.endswith(".json"):
    return load_bpe(os.path.expanduser(spec), key)
  if os.path.isfile(os.path.join(os.path.expanduser(spec), "tokenizer.json")):
    return load_hf_tokenizer(os.path.expanduser(spec), key=key)
  raise ValueError(f"{key}: expected 'bytes', 'bpe' or a path to a tokenizer.json (or to a model "
                   f"directory holding one), got {spec!r}")
