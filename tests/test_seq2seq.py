"""The seq2seq model against its equations written out in numpy (with and without additive
attention), teacher forcing's causality, and the digit-string data."""

import jax
import ml_collections
import numpy as np
import pytest

from jaxdl.data import parse_data
from jaxdl.data.digit_strings import START
from jaxdl.models import build_model

S = 3


@pytest.fixture(scope="module")
def models():
  """(model, variables, jitted apply) with and without attention, tiny widths, S = T = 3."""
  x = parse_data(dict(name="digit_strings", length=S, n=8, n_eval=2)).build().train.gather(
      np.arange(2))["x"]
  out = {}
  for attention in (True, False):
    model = build_model(ml_collections.ConfigDict(dict(
        name="seq2seq", src_len=S, embed_dim=3, hidden=4, attn_dim=5, attention=attention)))
    variables = model.init(jax.random.PRNGKey(0), x, train=False)
    out[attention] = (model, variables, jax.jit(
        lambda v, x, m=model: m.apply(v, x, train=False, mutable=["intermediates"])))
  return x, out


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _lstm(p, c, h, x):
  """The LSTM equations of jaxdl.models.rnn: gates from W_h h + W_x x + b, additive cell."""
  i, f, g, o = np.split(h @ p["wh"]["kernel"] + x @ p["wx"]["kernel"] + p["wx"]["bias"], 4, -1)
  c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
  return c, _sigmoid(o) * np.tanh(c)


def _forward(p, x, attention):
  """Logits and attention weights of the module docstring's equations, in float64 numpy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  emb = p["embed"]["embedding"][x]
  c = h = np.zeros((len(x), 4))
  annotations = []
  for s in range(S):
    c, h = _lstm(p["encoder"], c, h, emb[:, s])
    annotations.append(h)
  h_bsn = np.stack(annotations, 1)
  logits, alphas = [], []
  for t in range(x.shape[1] - S):
    inp, d = emb[:, S + t], p["decoder"]
    if attention:
      k = h_bsn @ p["w_k"]["kernel"] + p["w_k"]["bias"]
      e = (np.tanh((h @ d["w_q"]["kernel"])[:, None] + k) @ d["attend"]["v"]["kernel"])[..., 0]
      alpha = np.exp(e - e.max(-1, keepdims=True))
      alpha /= alpha.sum(-1, keepdims=True)
      ctx = np.einsum("bs,bsn->bn", alpha, h_bsn)
      c, h = _lstm(d["lstm"], c, h, np.concatenate([inp, ctx], -1))
      feats = np.concatenate([h, ctx], -1)
      alphas.append(alpha)
    else:
      c, h = _lstm(d["lstm"], c, h, inp)
      feats = h
    logits.append(feats @ p["head"]["kernel"] + p["head"]["bias"])
  return np.stack(logits, 1), (np.stack(alphas, 1) if alphas else None)


def test_forward_equals_the_equations(models):
  x, out = models
  for attention, (_, variables, apply) in out.items():
    logits, state = apply(variables, x)
    want, alpha = _forward(variables["params"], x, attention)
    assert logits.shape == (2, S, 11)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    if attention:
      got = np.asarray(state["intermediates"]["alpha"][0])
      np.testing.assert_allclose(got, alpha, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-6)


def test_teacher_forcing_is_causal(models):
  """Changing the decoder input at step j leaves the logits of steps < j exactly unchanged and
  changes step j's; changing a source digit changes every step."""
  x, out = models
  for _, variables, apply in out.values():
    base = np.asarray(apply(variables, x)[0])
    for j in range(1, S):
      moved = x.copy()
      moved[:, S + j] = (moved[:, S + j] + 1) % 10
      y = np.asarray(apply(variables, moved)[0])
      np.testing.assert_array_equal(y[:, :j], base[:, :j])
      assert np.abs(y[:, j] - base[:, j]).max() > 0
    moved = x.copy()
    moved[:, 0] = (moved[:, 0] + 1) % 10
    assert (np.abs(np.asarray(apply(variables, moved)[0]) - base).max(-1) > 0).all()


def test_digit_strings_layout():
  for op, expect in (("reverse", lambda s: s[:, ::-1]), ("sort", lambda s: np.sort(s, 1))):
    src = parse_data(dict(name="digit_strings", length=6, n=50, n_eval=5, op=op)).build()
    b = src.train.gather(np.arange(50))
    assert b["x"].shape == (50, 12) and b["y"].shape == (50, 6) and src.info["vocab_size"] == 11
    np.testing.assert_array_equal(b["y"], expect(b["x"][:, :6]))
    assert (b["x"][:, 6] == START).all()
    np.testing.assert_array_equal(b["x"][:, 7:], b["y"][:, :-1])


def test_input_of_another_length_than_src_plus_tgt_names_src_len(models):
  _, out = models
  model, variables, _ = out[True]
  for length in (S, 2 * S + 2):  # no decoder part; data.length = S + 1 against src_len = S
    with pytest.raises(ValueError, match="^model.src_len") as e:
      model.apply(variables, np.zeros((1, length), np.int32), train=False)
    assert "\n" not in str(e.value)


def test_greedy_decoding_is_the_argmax_of_its_own_teacher_forced_row(models):
  """y = greedy(src) is a fixed point: teacher-forcing [src, START, y_1 .. y_{T-1}] gives
  argmax logits_t = y_t at every t (the step-by-step loop and one full forward agree)."""
  from jaxdl.models.seq2seq import greedy_decode
  x, out = models
  for model, variables, apply in out.values():
    y = np.asarray(greedy_decode(model, variables, x[:, :S], START))
    assert y.shape == (2, S) and y.dtype == np.int32
    row = np.concatenate([x[:, :S], np.full((2, 1), START), y[:, :-1]], axis=1)
    np.testing.assert_array_equal(np.asarray(apply(variables, row)[0]).argmax(-1), y)
