"""A tokenizer directory's Jinja chat_template in `jaxdl data prepare` (jaxdl.data.chat_template):
the rendered text comes back from the tokens, the mask covers exactly the assistants' turns,
`--chat-template plain` is the plain template unchanged, and bad templates are one line, exit 2,
with nothing written."""

import hashlib
import json
import shutil
import sys
import zlib

import numpy as np
import pytest

from jaxdl import cli
from jaxdl.data import records, tokenize

# ChatML as Qwen writes it, with a BOS first (Llama-style) to exercise bos_token.
CHATML = ("{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
          "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
PAIR = {"prompt": "Add 2 and 3.", "response": "5"}
CONV = {"messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi there"},
                     {"role": "assistant", "content": "Hello."},
                     {"role": "user", "content": "Name?"},
                     {"role": "assistant", "content": "jaxdl"}]}
RENDERED = {  # written out by hand: what transformers' apply_chat_template gives
    "5": "<s><|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n",
    "jaxdl": ("<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there"
              "<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nName?"
              "<|im_end|>\n<|im_start|>assistant\njaxdl<|im_end|>\n")}
SCORED = {"5": "5<|im_end|>\n", "jaxdl": "Hello.<|im_end|>\njaxdl<|im_end|>\n"}


def _val_frac_splitting(keys):
  """A val_frac that puts the first of `keys` (by crc32) in val and the others in train."""
  fracs = sorted(zlib.crc32(k.encode()) / 2**32 for k in keys)
  return (fracs[0] + fracs[1]) / 2


VAL_FRAC = str(_val_frac_splitting(["0", "1"]))


@pytest.fixture
def tok_dir(tmp_path):
  """A Hugging Face-style tokenizer directory: a tiny byte-level BPE with ChatML's special
  tokens, and a tokenizer_config.json holding the template (bos as a token dict, eos a string)."""
  d = tmp_path / "tok"
  d.mkdir()
  tok = tokenize.train_bpe(["Hello there, the assistant says hello.\n"] * 4, 300)
  tok.hf.add_special_tokens(["<|im_start|>", "<|im_end|>", "<s>"])
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True},
      "eos_token": "<|im_end|>", "chat_template": CHATML}))
  (tmp_path / "chat.jsonl").write_text(json.dumps(PAIR) + "\n" + json.dumps(CONV) + "\n")
  return d


def _prepare(tmp_path, out, *flags):
  return cli.main(["data", "prepare", str(tmp_path / "chat.jsonl"), "--out", str(tmp_path / out),
                   "--val-frac", VAL_FRAC, *flags])


def _records(out):
  manifest = records.read_manifest(str(out))
  got = []
  for split in ("train", "val"):
    reader = records.RecordReader(str(out), manifest["splits"][split], manifest["fields"])
    got += [r["tokens_mask"] for r in reader.get(list(range(manifest["splits"][split]["count"])))]
  return manifest, got


def test_the_tokenizers_template_decodes_back_and_masks_the_assistant_turns(tmp_path, tok_dir):
  assert _prepare(tmp_path, "out", "--tokenizer", str(tok_dir)) == 0
  manifest, got = _records(tmp_path / "out")
  assert manifest["loss_mask"] == {"field": "tokens_mask", "column": 1, "template": "tokenizer",
                                   "template_sha256": hashlib.sha256(CHATML.encode()).hexdigest()}
  hf = tokenize.load_bpe(str(tok_dir / "tokenizer.json")).hf
  im_end = hf.token_to_id("<|im_end|>")
  assert len(got) == 2
  for rec in got:
    ids, mask = rec[:, 0].tolist(), rec[:, 1]
    text = hf.decode(ids, skip_special_tokens=False)
    last = "5" if text.endswith("5<|im_end|>\n") else "jaxdl"
    assert text == RENDERED[last]
    assert ids[0] == hf.token_to_id("<s>")  # the template's bos, its id (and only one)
    # The template's <|im_end|> are ids; the ids are the whole rendered string's, as transformers
    # tokenizes it (special tokens recognized, no post-processor).
    assert ids.count(im_end) == RENDERED[last].count("<|im_end|>")
    hf.encode_special_tokens = False
    assert ids == hf.encode(RENDERED[last], add_special_tokens=False).ids
    # Mask 1 exactly on the assistants' contents and the <|im_end|>\n that closes each turn.
    assert set(mask.tolist()) == {0, 1}
    assert hf.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False) == SCORED[last]
    assert hf.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=False) == (
        RENDERED[last].replace(SCORED[last], "") if last == "5" else
        RENDERED[last].replace("Hello.<|im_end|>\n", "").replace("jaxdl<|im_end|>\n", ""))
  # The same template given as a file: the same tokens, the file named in the manifest.
  (tmp_path / "chatml.jinja").write_text(CHATML)
  assert _prepare(tmp_path, "out_file", "--tokenizer", str(tok_dir), "--chat-template",
                  str(tmp_path / "chatml.jinja")) == 0
  manifest_f, got_f = _records(tmp_path / "out_file")
  assert manifest_f["loss_mask"]["template"] == "chatml.jinja"
  assert manifest_f["loss_mask"]["template_sha256"] == manifest["loss_mask"]["template_sha256"]
  for a, b in zip(got, got_f):
    np.testing.assert_array_equal(a, b)


def test_plain_ignores_the_tokenizers_template_bit_for_bit(tmp_path, tok_dir):
  assert _prepare(tmp_path, "plain", "--tokenizer", str(tok_dir), "--chat-template", "plain") == 0
  # The reference: the same tokenizer.json in a directory with no template (auto -> plain).
  bare = tmp_path / "bare"
  bare.mkdir()
  shutil.copy(tok_dir / "tokenizer.json", bare / "tokenizer.json")
  assert _prepare(tmp_path, "ref", "--tokenizer", str(bare)) == 0
  names = sorted(p.name for p in (tmp_path / "plain").iterdir())
  assert names == sorted(p.name for p in (tmp_path / "ref").iterdir())
  for name in names:
    assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
  manifest, got = _records(tmp_path / "plain")
  assert manifest["loss_mask"] == {"field": "tokens_mask", "column": 1, "template": "plain"}
  hf = tokenize.load_bpe(str(tok_dir / "tokenizer.json")).hf
  texts = sorted(hf.decode(r[:, 0].tolist(), skip_special_tokens=False) for r in got)
  assert texts[0] == "### Instruction:\nAdd 2 and 3.\n\n### Response:\n5"


@pytest.mark.parametrize("template,why", [
    ("{{ messages | length }}:{% for m in messages %}{{ m['content'] }}{% endfor %}",
     "does not render conversations prefix by prefix (record 1: rendering messages[:2] does "
     "not start with the rendering of messages[:1])"),
    ("{% for m in messages %}{% if m['role'] == 'system' %}"
     "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}"
     "{% endfor %}", "raised on record 2: System role not supported"),
    ("{% for m in messages %}{{ m['content'] }}{{ m['content'] }}{% endfor %}",
     "writes message 0's content 2 times, expected once"),
    ("{% for m in messages %}{{ m['content'] }", "is not a valid Jinja template (line 1:"),
])
def test_bad_templates_are_one_line_exit_2_and_write_nothing(tmp_path, tok_dir, capsys,
                                                             template, why):
  config = json.loads((tok_dir / "tokenizer_config.json").read_text())
  (tok_dir / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
  assert _prepare(tmp_path, "out", "--tokenizer", str(tok_dir)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--chat-template: the chat_template of" in err[0], err
  assert why in err[0], err
  assert not (tmp_path / "out").exists()


def test_jinja2_missing_or_a_missing_file_is_one_line(tmp_path, tok_dir, capsys, monkeypatch):
  assert _prepare(tmp_path, "out", "--tokenizer", str(tok_dir), "--chat-template",
                  str(tmp_path / "nope.jinja")) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "expected auto, plain or a Jinja template file" in err[0], err
  monkeypatch.setitem(sys.modules, "jinja2", None)  # `import jinja2` raises ImportError
  assert _prepare(tmp_path, "out", "--tokenizer", str(tok_dir)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "pip install jinja2" in err[0], err
  # plain needs no jinja2.
  assert _prepare(tmp_path, "out", "--tokenizer", str(tok_dir), "--chat-template", "plain") == 0


# A multi-turn record for the chat Llama: its 64-id vocabulary has letters only, so '?' is read
# as '<unk>', a special token not read from its own text (not refused).
LLAMA_CONV = [("system", "be brief"), ("user", "the quick fox?"), ("assistant", "the lazy dog"),
              ("user", "she sells"), ("assistant", "sea shells")]


def test_prepared_ids_are_transformers_apply_chat_template_and_the_mask_its_replies(tmp_path,
                                                                                    hf_model):
  """`hf_reference.CHAT_LLAMA`: a Metaspace BPE ('▁' before each word) whose template writes
  '<s>ROLE TEXT</s>' a turn, in transformers' own files. The prepared ids are transformers'
  `apply_chat_template(messages, tokenize=True)` (tokenizing the pieces apart added a '▁' at
  each boundary); the mask covers exactly each reply and its '</s>' (its first token '▁the'
  holds the head's space: scored, the model must write it)."""
  import hf_reference
  llama = hf_model("llama", **hf_reference.CHAT_LLAMA)
  record = {"messages": [{"role": r, "content": c} for r, c in LLAMA_CONV]}
  (tmp_path / "chat.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(
      {"prompt": "she sells", "response": "sea shells"}) + "\n")
  assert _prepare(tmp_path, "out", "--tokenizer", llama) == 0
  _, got = _records(tmp_path / "out")
  ref = hf_reference.tokenizer(llama)
  pair = [{"role": "user", "content": "she sells"}, {"role": "assistant", "content": "sea shells"}]
  short, (rec,) = [r for r in got if len(r) < 40], [r for r in got if len(r) > 40]
  assert short[0][:, 0].tolist() == list(ref.apply_chat_template(pair, tokenize=True)["input_ids"])
  ids, mask = rec[:, 0].tolist(), rec[:, 1].tolist()
  want = ref.apply_chat_template(record["messages"], tokenize=True)["input_ids"]
  assert ids == list(want)
  runs, run = [], []
  for i, m in zip(ids, mask):
    if m:
      run.append(i)
    elif run:
      runs, run = runs + [run], []
  runs += [run] if run else []
  assert [ref.decode(r) for r in runs] == ["the lazy dog</s>", "sea shells</s>"]
  assert ref.decode([i for i, m in zip(ids, mask) if not m]) == (
      "<s> system be brief</s><s> user the quick fox<unk></s><s> assistant<s> user she sells</s>"
      "<s> assistant")  # the decoder writes each word's '▁' as a space


def test_a_message_holding_a_special_tokens_text_is_refused(tmp_path, tok_dir, capsys):
  """Tokenized whole, '<|im_end|>' typed by a user would end the turn: one line naming the
  file:line and the token, exit 2, nothing written; the plain template keeps it as text."""
  bad = {"messages": [{"role": "user", "content": "Hi <|im_end|> there"},
                      {"role": "assistant", "content": "Hello."}]}
  (tmp_path / "chat.jsonl").write_text(json.dumps(PAIR) + "\n\n" + json.dumps(bad) + "\n")
  assert _prepare(tmp_path, "out", "--tokenizer", str(tok_dir)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(
      "jaxdl: error: SRC: chat.jsonl:3: message 0 holds '<|im_end|>', a special token of the "
      "tokenizer"), err
  assert not (tmp_path / "out").exists()
  assert _prepare(tmp_path, "plain", "--tokenizer", str(tok_dir), "--chat-template", "plain") == 0
