"""Tokenizers: bytes and byte-level BPE (train, save, load, round trip, end-of-text)."""

import json

import numpy as np
import pytest

from jaxdl.data import tokenize

CORPUS = [f"def f{i}(x):\n    return x * {i} + {i % 3}\n" for i in range(60)] + [
    "naïve café ✓ — unicode survives", "class A:\n    pass\n"]


@pytest.fixture(scope="module")
def bpe():
  return tokenize.train_bpe(CORPUS, 320)


def test_bytes_tokenizer_is_utf8():
  tok = tokenize.bytes_tokenizer()
  ids = tok.encode("é!")
  np.testing.assert_array_equal(ids, [0xC3, 0xA9, 0x21])
  assert (tok.vocab_size, tok.eot_id) == (257, 256)
  assert tok.decode(np.r_[256, ids, 256]) == "é!"   # end-of-text ids are dropped
  assert tok.fingerprint == "bytes"


def test_bpe_trains_round_trips_and_compresses(bpe, tmp_path):
  assert bpe.name == "bpe" and bpe.vocab_size <= 320
  assert bpe.eot_id == 0 == bpe.hf.token_to_id("<|endoftext|>")
  unseen = "def g(y):\n    return y ** 2  # ünïcödé ✓\n"
  for text in [*CORPUS, unseen]:
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert bpe.eot_id not in ids   # ordinary text never produces end-of-text
  # The merges learned on the corpus make it shorter than its bytes.
  n_tokens = sum(len(bpe.encode(t)) for t in CORPUS)
  n_bytes = sum(len(t.encode()) for t in CORPUS)
  assert n_bytes / n_tokens > 2.0, n_bytes / n_tokens
  # Saved and loaded: the same tokenizer (fingerprint, ids); training again gives the same one.
  path = tmp_path / "tokenizer.json"
  bpe.save(str(path))
  loaded = tokenize.get_tokenizer("bpe", str(tmp_path))
  assert loaded.fingerprint == bpe.fingerprint == tokenize.train_bpe(CORPUS, 320).fingerprint
  np.testing.assert_array_equal(loaded.encode(unseen), bpe.encode(unseen))
  assert tokenize.get_tokenizer(str(path)).vocab_size == bpe.vocab_size


ADVERSARIAL = ["<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|endo",
               "emoji 😀👩‍👩‍👧 flags 🇫🇷", " " * 300 + "\t\n" * 50, "\r\n\x00\x7f",
               "mixed: Кириллица 漢字 العربية हिन्दी ✓", ""]


@pytest.mark.parametrize("name", ["bytes", "bpe", "bpe_loaded"])
def test_text_round_trips_and_never_encodes_to_end_of_text(name, bpe, tmp_path):
  """Only packing inserts end-of-text: the special token's own text is text, and decode(encode(s))
  is s for adversarial strings (also for a tokenizer.json read back from disk)."""
  tok = {"bytes": tokenize.bytes_tokenizer(), "bpe": bpe}.get(name)
  if tok is None:
    bpe.save(str(tmp_path / "tokenizer.json"))
    tok = tokenize.get_tokenizer("bpe", str(tmp_path))
  for text in ADVERSARIAL:
    ids = tok.encode(text)
    assert tok.eot_id not in ids, (name, text)
    assert tok.decode(ids) == text, (name, text)
  ids_a, ids_b = tok.encode_batch(["a<|endoftext|>b", "ab"])
  assert len(ids_a) > len(ids_b)
  with pytest.raises(ValueError, match=r"^text: not UTF-8 text \(surrogates not allowed at "
                                       r"character 1, '\\ud800'\)$"):
    tok.encode("a\ud800b")


def test_bad_tokenizers_are_one_line_errors(bpe, tmp_path):
  with pytest.raises(ValueError, match=r"^data.tokenizer: tokenizer file not found: '.*nope"):
    tokenize.get_tokenizer(str(tmp_path / "nope.json"))
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match=r"^data.tokenizer: cannot read '.*bad.json' as a "):
    tokenize.get_tokenizer(str(bad))
  # A tokenizer without '<|endoftext|>' cannot separate packed documents.
  spec = json.loads(bpe.hf.to_str())
  spec["added_tokens"] = []
  spec["model"]["vocab"].pop("<|endoftext|>")
  no_eot = tmp_path / "no_eot.json"
  no_eot.write_text(json.dumps(spec))
  with pytest.raises(ValueError, match="has no '<|endoftext|>' token"):
    tokenize.get_tokenizer(str(no_eot))
  with pytest.raises(ValueError, match="^data.tokenizer: expected 'bytes', 'bpe' or a path"):
    tokenize.get_tokenizer("sentencepiece")
  with pytest.raises(ValueError, match="^--vocab: a byte-level BPE needs at least 257"):
    tokenize.train_bpe(CORPUS, 100)
