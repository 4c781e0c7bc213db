"""Scoring text and answer choices with a trained language model (`jaxdl eval`'s library).

Letters: B rows of a scoring batch, L the model's context (block_size), N tokens of a stream.
Every number here is a sum of the `lm` task's per-token loss, CE_t = -log p(z_t | context)
(`jaxdl.train.token_losses.next_token_ce`), over the targets a request weighs with 1.

Text (`text_stream`, `score_stream`). The stream is z_0 z_1 .. z_N: z_0 the tokenizer's end of text
(the separator the model saw before every document in training, and lm-evaluation-harness's
prefix token for rolling log-likelihoods) followed by the text's N tokens, so every token of the
text is scored; a model whose embedding has no row for the end of text (a 256-token byte
model) has no prefix, and the text's first token is context only. Striding rule, for a stride S
in 1..L: window k reads z[kS : kS + L] and predicts z[kS + 1 : kS + L + 1] (clipped at z_N); it
scores only the targets past the previous window's last one, kS - S + L (0 for k = 0), and the
windows stop at the first that reaches z_N. Every target is scored exactly once, and each past the
first window is predicted from at least L - S tokens before it (S = L: disjoint windows, the
cheapest; the default S = L / 2 computes each token about twice). With T scored targets and Y
the UTF-8 bytes they spell (the whole text's bytes when the prefix is there):

  loss = sum_t CE_t / T (nats per token)   perplexity = exp(loss)
  bits per byte = sum_t CE_t / (ln 2 * Y)

Multiple choice (`choice_requests`, `choice_scores`), as lm-evaluation-harness's loglikelihood
and its multiple_choice output: an item {"context", "choices", "answer"}; context c and choice
a are split as the harness does (trailing spaces of c move to the front of a; the choice's
tokens are those of encode(c + a) past encode(c)'s length), and
  ll_i = sum over the choice's tokens of log p(token | everything before it),
the input cut to its last L + 1 tokens when longer; acc = [argmax_i ll_i == answer],
acc_norm = [argmax_i ll_i / bytes_i == answer], bytes_i the UTF-8 length of choice i (the
harness divides by the choice string's length, the same for ASCII). Ties go to the first choice.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import numpy as np

from jaxdl.train.token_losses import next_token_ce


def make_scorer(model, variables: dict) -> Callable:
  """`score(x_BxL, y_BxL, w_BxL) -> nll_B`, sum_t w_bt CE_bt per row, jitted: `x` the input
  tokens, `y` the targets (x shifted by one), `w` 1 on the targets a row scores. Rows are
  right-padded (w = 0 there), which a causal model's earlier positions never see."""

  @jax.jit
  def score(x_BxL, y_BxL, w_BxL):
    logits_BxLxV = model.apply(variables, x_BxL, train=False)
    return (next_token_ce(logits_BxLxV, y_BxL) * w_BxL).sum(-1)

  return score


def sum_nll(score: Callable, requests: list[tuple[np.ndarray, np.ndarray]], context: int,
            batch: int = 8) -> np.ndarray:
  """float64 (R,): each request's summed CE. A request is (tokens, scored): tokens z_0..z_n
  (2 <= n + 1 <= L + 1) and how many of its last targets it scores (1..n), or an (n,) array of
  each target's weight (a loss mask: `score_stream`'s `mask_N`). Requests run in
  batches of `batch` rows of L tokens (the last batch padded), so one program serves all."""
  out = np.zeros((len(requests),), np.float64)
  for start in range(0, len(requests), batch):
    chunk = requests[start:start + batch]
    x_BxL = np.zeros((batch, context), np.int32)
    y_BxL = np.zeros((batch, context), np.int32)
    w_BxL = np.zeros((batch, context), np.float32)
    for b, (tokens, scored) in enumerate(chunk):
      n = len(tokens) - 1
      x_BxL[b, :n], y_BxL[b, :n] = tokens[:-1], tokens[1:]
      if np.ndim(scored):
        w_BxL[b, :n] = scored
      else:
        w_BxL[b, n - scored:n] = 1.0
    nll_B = np.asarray(score(x_BxL, y_BxL, w_BxL), np.float64)
    out[start:start + len(chunk)] = nll_B[:len(chunk)]
  return out


def windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
  """The striding rule (module docstring) for a stream z_0..z_{N-1} of `n_tokens`: a list of
  (start, end, scored): window tokens z[start:end], its last `scored` targets new."""
  if not 1 <= stride <= context:
    raise ValueError(f"--stride: must be in 1..{context} (the model's context), got {stride}")
  out, last = [], 0  # last: the last target index scored so far
  start = 0
  while last < n_tokens - 1:
    end = min(start + context + 1, n_tokens)
    out.append((start, end, end - 1 - last))
    last = end - 1
    start += stride
  return out


def text_stream(tok, text_ids: np.ndarray, vocab_size: int) -> tuple[np.ndarray, bool]:
  """(z_0..z_N, whether z_0 is the end-of-text prefix) for the text's tokens (module
  docstring)."""
  if 0 <= tok.eot_id < vocab_size:
    return np.concatenate([[tok.eot_id], text_ids]).astype(np.int32), True
  return np.asarray(text_ids, np.int32), False


def stream_requests(stream: np.ndarray, context: int, stride: int, mask_N=None) -> list:
  """`sum_nll` requests of a stream z_0..z_N under the striding rule: each window's new targets;
  with a loss mask m (0/1 per stream token) each weighed by its m."""
  plan = windows(len(stream), context, stride)
  if mask_N is None:
    return [(stream[s:e], k) for s, e, k in plan]
  mask_N = np.asarray(mask_N, np.float32)
  return [(stream[s:e], np.concatenate([np.zeros(e - 1 - s - k, np.float32), mask_N[e - k:e]]))
          for s, e, k in plan]


def score_stream(score: Callable, stream: np.ndarray, context: int, stride: int,
                 batch: int = 8) -> tuple[float, int]:
  """(sum of CE over every target z_1..z_N, N) under the striding rule."""
  requests = stream_requests(stream, context, stride)
  return float(sum_nll(score, requests, context, batch).sum()), len(stream) - 1


def score_responses(score: Callable, docs: list, masks: list, eot: int, context: int,
                    stride: int, batch: int = 8) -> tuple[float, int]:
  """(sum of m_t CE_t, sum of m_t) over instruction records, each scored alone as fine-tuning
  packs it (`jaxdl.data.packing`: its own segment, positions from 0): z = e d e, m = 0, the
  record's mask (1 on the responses), 1 on the closing e; a record longer than the context is
  strided as a stream."""
  requests, scored = [], 0
  for d, m in zip(docs, masks):
    z = np.concatenate([[eot], d, [eot]]).astype(np.int32)
    m_N = np.concatenate([[0], m, [1]])
    requests += stream_requests(z, context, stride, m_N)
    scored += int(m_N[1:].sum())
  return float(sum_nll(score, requests, context, batch).sum()), scored


def text_metrics(nll: float, tokens: int, n_bytes: int) -> dict:
  """loss (nats/token), perplexity, bits per byte (module docstring) of a summed CE."""
  loss = nll / tokens
  return {"tokens": tokens, "bytes": n_bytes, "loss": loss, "perplexity": math.exp(loss),
          "bits_per_byte": nll / math.log(2.0) / n_bytes}


def encode_pair(tok, context: str, choice: str) -> tuple[np.ndarray, np.ndarray]:
  """(context tokens, choice tokens) split as lm-evaluation-harness does (module docstring)."""
  n_spaces = len(context) - len(context.rstrip())
  if n_spaces:
    context, choice = context[:-n_spaces], context[-n_spaces:] + choice
  whole = tok.encode(context + choice)
  n = len(tok.encode(context))
  return whole[:n], whole[n:]


def choice_requests(tok, items: list[dict], context: int) -> tuple[list, list[int]]:
  """(requests for `sum_nll`, the item index of each) for every choice of every item; an
  input longer than L + 1 tokens keeps its last L + 1. ValueError 'item i: ...' for a choice
  that encodes to no tokens or a context to none."""
  requests, owner = [], []
  for i, item in enumerate(items):
    for a in item["choices"]:
      ctx_ids, cont_ids = encode_pair(tok, item["context"], a)
      if not len(ctx_ids) or not len(cont_ids):
        what = "context" if not len(ctx_ids) else f"choice {a!r}"
        raise ValueError(f"item {i}: its {what} encodes to no tokens")
      tokens = np.concatenate([ctx_ids, cont_ids]).astype(np.int32)[-(context + 1):]
      requests.append((tokens, min(len(cont_ids), len(tokens) - 1)))
      owner.append(i)
  return requests, owner


def choice_scores(lls: np.ndarray, owner: list[int], items: list[dict]) -> dict:
  """acc and acc_norm (module docstring) from each choice's log-likelihood (-summed CE)."""
  per_item = [[] for _ in items]
  for ll, i in zip(lls, owner):
    per_item[i].append(ll)
  acc = norm = 0
  for item, ll in zip(items, per_item):
    ll = np.asarray(ll)
    n_bytes = np.asarray([len(a.encode("utf-8")) for a in item["choices"]], np.float64)
    acc += int(np.argmax(ll)) == item["answer"]
    norm += int(np.argmax(ll / n_bytes)) == item["answer"]
  return {"items": len(items), "acc": acc / len(items), "acc_norm": norm / len(items),
          "loglikelihoods": per_item}


def score_choices(score: Callable, tok, items: list[dict], context: int, batch: int = 8) -> dict:
  """`choice_scores` of `items` under the model behind `score`."""
  requests, owner = choice_requests(tok, items, context)
  return choice_scores(-sum_nll(score, requests, context, batch), owner, items)

