"""Packing documents into windows: segment / position ids, streams, and the GPT's document mask."""

import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxdl.data import packing
from jaxdl.models import build_model
from jaxdl.models.gpt import gpt_config
from jaxdl.train.tasks import make_task

EOT = 0


def test_segment_positions_by_hand():
  # A window that starts inside a document (segment 0), then two documents opened by e = 0.
  x_BxT = np.array([[7, 8, 0, 5, 6, 6, 0, 9]])
  seg, pos = packing.segment_positions(x_BxT, EOT)
  np.testing.assert_array_equal(seg, [[0, 0, 1, 1, 1, 1, 2, 2]])
  np.testing.assert_array_equal(pos, [[0, 1, 0, 1, 2, 3, 0, 1]])


def test_doc_stream_reads_what_the_joined_array_holds():
  rng = np.random.default_rng(0)
  docs = [rng.integers(1, 50, n).astype(np.int32) for n in (3, 0, 7, 1, 5)]
  joined = packing.join_documents(docs, EOT)
  assert len(joined) == sum(len(d) + 1 for d in docs) == 21
  stream = packing.DocStream(lambda idx: [docs[i] for i in idx], [len(d) for d in docs], EOT)
  assert stream.length == len(joined)
  for a in range(len(joined)):
    for b in range(a + 1, len(joined) + 1):
      np.testing.assert_array_equal(stream.read(a, b), joined[a:b], err_msg=f"[{a}:{b}]")


def test_window_split_targets_are_the_next_tokens():
  tokens_L = np.arange(1, 24, dtype=np.int32) % 7  # 0 = e every 7 tokens
  src = packing.packed_source(packing.ArrayStream(tokens_L), packing.ArrayStream(tokens_L), t=5,
                              max_eval_windows=0, eot_id=EOT, vocab_size=7, segment_ids=True,
                              key="data.path")
  assert src.train.num == (len(tokens_L) - 1) // 5 == 4
  batch = src.train.gather(np.array([1, 3]))
  np.testing.assert_array_equal(batch["x"], [tokens_L[5:10], tokens_L[15:20]])
  np.testing.assert_array_equal(batch["y"], [tokens_L[6:11], tokens_L[16:21]])
  # tokens 5..9 are 6 0 1 2 3: the e at index 1 opens segment 1.
  np.testing.assert_array_equal(batch["segment_ids"][0], [0, 1, 1, 1, 1])
  np.testing.assert_array_equal(batch["positions"][0], [0, 0, 1, 2, 3])


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_packed_logits_equal_each_document_run_alone(pos):
  """Two rows, each packing several documents: every document's logits equal those of the
  document run alone (a different computation: no mask, positions 0..n-1), to 1e-5; and the lm
  task hands the ids to the model: its loss is the cross-entropy of the packed logits."""
  model = build_model(ml_collections.ConfigDict(gpt_config(
      vocab_size=31, block_size=16, n_layer=2, n_head=2, d_model=16, pos=pos)))
  rng = np.random.default_rng(1)
  rows = [[4, 3, 6], [2, 8, 3]]   # document lengths; each row is 16 tokens with its e's
  docs = [[rng.integers(1, 31, n) for n in lengths] for lengths in rows]
  x_BxT = np.stack([packing.join_documents(d, EOT) for d in docs])
  assert x_BxT.shape == (2, 16)
  seg, positions = packing.segment_positions(x_BxT, EOT)
  params = jax.jit(lambda x: model.init(jax.random.PRNGKey(0), x, train=False))(x_BxT)
  apply = jax.jit(lambda x, **ids: model.apply(params, x, train=False, **ids))
  packed_BxTxV = apply(jnp.asarray(x_BxT), segment_ids=seg, positions=positions)
  unmasked_BxTxV = apply(jnp.asarray(x_BxT))
  # Each document alone, zero-padded at the end to T (causal: the padding changes nothing
  # before it), all six in one batch.
  alone_NxT = np.zeros((6, 16), np.int32)
  for n, d in enumerate(d for row_docs in docs for d in row_docs):
    alone_NxT[n, :len(d) + 1] = packing.join_documents([d], EOT)
  alone_NxTxV = apply(jnp.asarray(alone_NxT))
  n = 0
  for b, row_docs in enumerate(docs):
    start = 0
    for d in row_docs:
      end = start + len(d) + 1
      np.testing.assert_allclose(packed_BxTxV[b, start:end], alone_NxTxV[n, :end - start],
                                 atol=1e-5, rtol=1e-5)
      start, n = end, n + 1
  # The mask matters: without it the later documents see earlier ones.
  assert float(jnp.abs(unmasked_BxTxV - packed_BxTxV).max()) > 1e-2
  ce_BxT = optax.softmax_cross_entropy_with_integer_labels(packed_BxTxV[:, :-1], x_BxT[:, 1:])
  batch = {"x": jnp.asarray(x_BxT[:, :-1]), "y": jnp.asarray(x_BxT[:, 1:]),
           "segment_ids": seg[:, :-1], "positions": positions[:, :-1]}
  task = make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  loss, _ = jax.jit(lambda b: task.loss_fn(model.apply, params["params"], {}, b, {}, False))(
      batch)
  np.testing.assert_allclose(float(loss), float(ce_BxT.mean()), rtol=1e-5)


def test_bits_per_byte_is_total_nats_over_total_utf8_bytes():
  """Raw-byte documents 'ab', 'é' (2 bytes), 'xyz€' (€: 3 bytes) packed in windows of T = 3:
  the eval targets are (a b e) (C3 A9 e) (x y z) (E2 82 AC), 10 bytes in 12 tokens. A model
  whose logits are constant has CE = ln V per token, so the eval split's bits per byte is
  12 ln V / ln 2 / 10 = 1.2 log2 V, through the loop's eval over two batches (3 windows, then
  1 padded to 3) whose own bytes per token differ (7/9 and 3/3): a mean of per-batch ratios
  would give 1.1 log2 V. A train batch's is its own total nats over its total bytes."""
  from jaxdl.data.pipeline import Dataset
  from jaxdl.data.tokenize import bytes_tokenizer
  from jaxdl import train
  from jaxdl.train import step, strategies
  tok = bytes_tokenizer()
  stream = packing.ArrayStream(packing.join_documents(tok.encode_batch(["ab", "é", "xyz€"]),
                                                      tok.eot_id))
  src = packing.packed_source(stream, stream, t=3, max_eval_windows=0, eot_id=tok.eot_id,
                              vocab_size=tok.vocab_size, segment_ids=False, key="data.path",
                              bytes_V=tok.token_bytes())
  ds = Dataset(src, batch_size=2, eval_batch_size=3, seed=0, shuffle=False, name="t")
  assert src.eval.num == 4 and len(ds.eval_batches()) == 2
  v = tok.vocab_size

  def apply_fn(variables, x_BxT, train, **_):
    del variables, train
    return jnp.zeros((*x_BxT.shape, v))

  task = make_task(ml_collections.ConfigDict({"task": "lm", "train": {}}))
  eval_step = step.make_eval_step(apply_fn, task.loss_fn)
  state = types.SimpleNamespace(params={}, model_state={})   # the model has no parameters
  eval_fn = jax.jit(lambda batch: eval_step(state, batch))
  metrics = train.evaluate(lambda _, batch: eval_fn(batch), state, ds,
                          strategies.make_strategy("jit", 1))
  np.testing.assert_allclose(metrics["loss"], np.log(v), rtol=1e-6)
  np.testing.assert_allclose(metrics["bits_per_byte"], 1.2 * np.log2(v), rtol=1e-6)
  train_batch = src.train.gather(np.array([0, 1]))        # (a b e) (C3 A9 e): 4 bytes, 6 tokens
  _, (m, _) = task.loss_fn(apply_fn, {}, {}, train_batch, {}, False)
  np.testing.assert_allclose(float(m["bits_per_byte"]), 6 * np.log2(v) / 4, rtol=1e-6)


@pytest.mark.parametrize("cache_tokens", [0, 12, 10_000])  # none, about two documents, all
def test_doc_stream_reads_each_document_once_while_cached_and_windows_never_change(cache_tokens):
  rng = np.random.default_rng(0)
  docs = [rng.integers(0, 50, size=n) for n in (5, 1, 7, 3, 9, 4)]
  reads = []

  def get(indices):
    reads.extend(indices)
    return [docs[i] for i in indices]

  stream = packing.DocStream(get, np.array([len(d) for d in docs]), 99,
                             cache_tokens=cache_tokens)
  whole = packing.join_documents(docs, 99)
  assert stream.length == len(whole)
  windows = [(int(a), int(a) + 4) for a in rng.integers(0, len(whole) - 4, size=60)]
  for a, b in windows:
    np.testing.assert_array_equal(stream.read(a, b), whole[a:b])
  if cache_tokens >= len(whole):
    assert sorted(reads) == sorted(set(reads))  # each document read once
  else:
    assert len(reads) > len(set(reads))  # evicted documents read again
  assert stream._cached <= cache_tokens  # noqa: SLF001
