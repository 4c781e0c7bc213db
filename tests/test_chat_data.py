"""Instruction data (jaxdl.data.chat): the template and its loss mask, packing that keeps the mask
aligned, the lm loss per response token, bad records, `init_from`, and finetune_lora:smoke."""

import json
import zlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.data import chat, packing, records
from jaxdl.models import build_model, lora
from jaxdl.train import init_from
from jaxdl.train.tasks import make_task

EOT = 256  # the bytes tokenizer's end-of-text


def _val_frac_splitting(keys):
  """A val_frac that puts the first of `keys` (by crc32) in val and the others in train."""
  fracs = sorted(zlib.crc32(k.encode()) / 2**32 for k in keys)
  return (fracs[0] + fracs[1]) / 2


def test_template_and_mask_of_a_two_record_file(tmp_path):
  src = tmp_path / "chat.jsonl"
  pair = {"prompt": "Add 2 and 3.", "response": "5"}
  conv = {"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello."},
                       {"role": "user", "content": "Name?"},
                       {"role": "assistant", "content": "jaxdl"}]}
  src.write_text(json.dumps(pair) + "\n\n" + json.dumps(conv) + "\n")  # a blank line is skipped
  out = tmp_path / "prep"
  val_frac = _val_frac_splitting(["0", "1"])
  assert cli.main(["data", "prepare", str(src), "--out", str(out), "--tokenizer", "bytes",
                   "--val-frac", str(val_frac)]) == 0
  manifest = records.read_manifest(str(out))
  assert manifest["loss_mask"] == {"field": "tokens_mask", "column": 1, "template": "plain"}
  got = {}
  for split in ("train", "val"):
    reader = records.RecordReader(str(out), manifest["splits"][split], manifest["fields"])
    (rec,) = reader.get([0])
    got[split] = rec["tokens_mask"]
  first = "val" if zlib.crc32(b"0") / 2**32 < val_frac else "train"
  second = "train" if first == "val" else "val"
  # The pair: the mask is 0 exactly on the template and prompt, 1 on the response.
  prompt = "### Instruction:\nAdd 2 and 3.\n\n### Response:\n"
  ids, mask = got[first][:, 0], got[first][:, 1]
  assert bytes(ids.astype(np.uint8)).decode() == prompt + "5"
  np.testing.assert_array_equal(mask, [0] * len(prompt.encode()) + [1])
  # The conversation: both assistant turns scored, the gap between turns and the rest not.
  text = ("### System:\nBe brief.\n\n### Instruction:\nHi\n\n### Response:\nHello.\n\n"
          "### Instruction:\nName?\n\n### Response:\njaxdl")
  ids, mask = got[second][:, 0], got[second][:, 1]
  assert bytes(ids.astype(np.uint8)).decode() == text
  scored = "".join(chr(i) for i, m in zip(ids, mask) if m)
  assert scored == "Hello.jaxdl"
  assert mask[text.index("Hello.") - 1] == 0 and mask[text.index("\n\n### Instruction:\nName")] == 0


def test_packing_keeps_the_mask_aligned_with_tokens_and_segments():
  rng = np.random.default_rng(0)
  docs, masks = [], []
  for n_prompt, n_resp in ((3, 2), (5, 1), (2, 4), (4, 3), (1, 1), (6, 2)):
    docs.append(rng.integers(0, 200, n_prompt + n_resp).astype(np.int32))
    masks.append(np.r_[np.zeros(n_prompt), np.ones(n_resp)].astype(np.uint8))
  joined = packing.join_documents(docs, EOT)
  joined_mask = packing.join_masks(masks)
  stream = packing.DocStream(lambda idx: [(docs[i], masks[i]) for i in idx],
                             [len(d) for d in docs], EOT, masked=True)
  for a in range(len(joined)):
    for b in range(a + 1, len(joined) + 1):
      ids, m = stream.read_pair(a, b)
      np.testing.assert_array_equal(ids, joined[a:b])
      np.testing.assert_array_equal(m, joined_mask[a:b])
  t = 8
  src = packing.packed_source(stream, stream, t=t, max_eval_windows=0, eot_id=EOT,
                              vocab_size=257, segment_ids=True, key="k",
                              bytes_V=np.r_[np.ones(256), 0].astype(np.int32))
  batch = src.train.gather(np.arange(src.train.num))
  for j in range(src.train.num):
    y, m = batch["y"][j], batch["loss_mask"][j]
    np.testing.assert_array_equal(y, joined[j * t + 1:j * t + t + 1])
    np.testing.assert_array_equal(m, joined_mask[j * t + 1:j * t + t + 1])
    for i in np.flatnonzero(m):
      # A scored target is a response token of the segment its input is in, or the e that closes
      # that segment (predicted from the document's last token, never from an e).
      assert batch["x"][j, i] != EOT or y[i] != EOT
      if y[i] == EOT:
        assert i + 1 == t or batch["segment_ids"][j, i + 1] == batch["segment_ids"][j, i] + 1
  # Train rows: bytes per scored token (e decodes to none); eval rows: the split's S and R.
  n_B = batch["loss_mask"].sum(-1)
  want = (batch["loss_mask"] * (batch["y"] != EOT)).sum(-1) / np.maximum(n_B, 1)
  np.testing.assert_allclose(batch["bytes_per_token"], want, rtol=1e-6)
  ev = src.eval.gather(np.arange(src.eval.num))
  np.testing.assert_allclose(ev["scored_per_row"], ev["loss_mask"].sum() / src.eval.num)
  # Without a mask the batch has none of the new keys.
  plain = packing.packed_source(packing.ArrayStream(joined), packing.ArrayStream(joined), t=t,
                                max_eval_windows=0, eot_id=EOT, vocab_size=257,
                                segment_ids=True, key="k")
  assert set(plain.train.gather(np.arange(2))) == {"x", "y", "segment_ids", "positions"}


def test_lm_loss_is_the_mean_per_response_token():
  model = build_model(ml_collections.ConfigDict(dict(
      name="gpt", vocab_size=257, d_model=16, n_layer=1, n_head=2, block_size=8)))
  rng = np.random.default_rng(1)
  x_BxT = rng.integers(0, 257, (4, 8)).astype(np.int32)
  y_BxT = rng.integers(0, 257, (4, 8)).astype(np.int32)
  m_BxT = (rng.random((4, 8)) < 0.4).astype(np.float32)
  # Compiled, not run op by op: each eager operation is a program of its own (215 of them here).
  params = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(x_BxT[:1])["params"]
  task = make_task(ml_collections.ConfigDict(dict(task="lm", train={})))
  loss_fn = jax.jit(lambda params, batch: task.loss_fn(model.apply, params, {}, batch, {}, False))
  logits = jax.jit(model.apply, static_argnames="train")({"params": params}, x_BxT,
                                                         train=False).astype(jnp.float32)
  ce_BxT = -jnp.take_along_axis(jax.nn.log_softmax(logits), y_BxT[..., None], -1)[..., 0]
  by_hand = float((ce_BxT * m_BxT).sum() / m_BxT.sum())
  batch = {"x": x_BxT, "y": y_BxT, "loss_mask": m_BxT}
  loss, (metrics, _) = loss_fn(params, batch)
  np.testing.assert_allclose(float(loss), by_hand, rtol=1e-5)
  # Eval: two padded batches weighted by rows add up to the split's nats over its scored tokens.
  s = m_BxT.sum() / 4
  total = 0.0
  for rows in (slice(0, 3), slice(3, 4)):
    b = {k: np.concatenate([v[rows], v[:1]]) for k, v in batch.items()}
    n = rows.stop - rows.start
    b["mask"] = np.r_[np.ones(n), 0].astype(np.float32)
    b["scored_per_row"] = np.full(n + 1, s, np.float32)
    loss_b, _ = loss_fn(params, b)
    total += float(loss_b) * n
  np.testing.assert_allclose(total / 4, by_hand, rtol=1e-5)
  # Without the mask: the plain mean over every target.
  loss, _ = loss_fn(params, {"x": x_BxT, "y": y_BxT})
  np.testing.assert_allclose(float(loss), float(ce_BxT.mean()), rtol=1e-5)


@pytest.mark.parametrize("line,why", [
    ('{"prompt": "a"}', "line 2: expected a string 'response', got none"),
    ('{"prompt": "a", "response": "  "}', "line 2: 'response' is empty"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', "line 2: message 0: unknown role 'bot'"),
    ('{"text": "a"}', "line 2: expected 'prompt' and 'response', or 'messages'"),
    ('not json', "line 2: not JSON"),
    # JSON can escape half a surrogate pair; the text is then not UTF-8 and cannot be tokenized.
    ('{"prompt": "x\\ud800", "response": "r"}',
     "line 2: 'prompt' is not UTF-8 text (surrogates not allowed at character 1, '\\ud800')"),
])
def test_bad_records_are_one_line_exit_2(tmp_path, capsys, line, why):
  src = tmp_path / "bad.jsonl"
  src.write_text('{"prompt": "p", "response": "r"}\n' + line + "\n")
  assert cli.main(["data", "prepare", str(src), "--out", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and f"SRC: bad.jsonl {why}" in err[0], err
  assert chat.is_chat_file(str(src)) and not (tmp_path / "o").exists()


def test_stdlib_instructions_are_docstring_to_signature(tmp_path):
  (tmp_path / "m.py").write_text('def f(a, b=1) -> int:\n  """Adds.\n\n  More."""\n'
                                 'def g():\n  pass\n')
  assert chat.stdlib_instructions(str(tmp_path), 10) == [
      {"prompt": "Adds.", "response": "def f(a, b=1) -> int:", "split_key": "m.py"}]


def test_finetune_lora_smoke_and_init_from(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("JAXDL_CACHE", str(tmp_path / "cache"))
  workdir = tmp_path / "ft"
  assert cli.main(["train", "finetune_lora:smoke", "--workdir", str(workdir), "--no-progress",
                   "--set", "train.plot=False"]) == 0
  out = capsys.readouterr().out
  summary = json.loads(out[out.rindex('{\n  "workdir"'):])
  assert summary["step"] == 4 and np.isfinite(summary["val_loss_per_response_token"])
  assert 0 < summary["trainable_params"] < summary["total_params"]
  assert summary["optimizer_state_bytes"] == 2 * 4 * summary["trainable_params"]  # AdamW m, v
  # init_from: a new run's base parameters are the trained run's with its adapters merged
  # (W + (alpha / r) A B), its own adapters fresh (B = 0).
  from jaxdl.config import load_config
  from jaxdl.train import assembly
  from jaxdl.train.checkpoint import load_state
  config, _ = load_config("finetune_lora:smoke", ["init_from=" + str(workdir)])
  state = assembly.build(config).init_state()
  adapters, base = lora.split(jax.device_get(state.params))
  _, merged = lora.merge(build_model(config.model), load_state(workdir)[1]["params"])
  trained = lora.split(jax.device_get(merged))[1]
  assert base.keys() == trained.keys()
  for k in base:
    np.testing.assert_array_equal(base[k], trained[k])
  assert all(not np.any(v) for k, v in adapters.items() if k.endswith("/b"))
  with pytest.raises(ValueError, match="^init_from: 'nowhere' is neither"):
    init_from.check(ml_collections.ConfigDict({"init_from": "nowhere"}))
