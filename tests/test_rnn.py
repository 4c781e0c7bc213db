"""RNN and LSTM against their recurrences written out with numpy."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models

X = jax.random.normal(jax.random.key(0), (3, 5, 4))  # B=3, T=5, D=4


def _sigmoid(a):
  return 1 / (1 + np.exp(-a))


def _model(**kw):
  return models.build_model(ml_collections.ConfigDict(kw))


def test_rnn_matches_recurrence():
  m = _model(name="rnn", hidden=6, out=2)
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  p = jax.tree.map(np.asarray, v["params"]["rnn_0"])
  h = np.zeros((3, 6), np.float32)
  for t in range(5):
    h = np.tanh(h @ p["wh"]["kernel"] + X[:, t] @ p["wx"]["kernel"] + p["wx"]["bias"])
  head = v["params"]["head"]
  np.testing.assert_allclose(m.apply(v, X, train=False), h @ head["kernel"] + head["bias"],
                             atol=1e-5)


def test_lstm_matches_recurrence():
  m = _model(name="lstm", hidden=6, out=2)
  v = jax.jit(lambda: m.init(jax.random.key(1), X, train=False))()
  p = jax.tree.map(np.asarray, v["params"]["lstm_0"])
  h = c = np.zeros((3, 6), np.float32)
  for t in range(5):
    z = h @ p["wh"]["kernel"] + X[:, t] @ p["wx"]["kernel"] + p["wx"]["bias"]
    i, f, g, o = np.split(z, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
  head = v["params"]["head"]
  y = jax.jit(lambda v, x: m.apply(v, x, train=False))(v, X)
  np.testing.assert_allclose(y, h @ head["kernel"] + head["bias"], atol=1e-5)


def test_inputs_images_flat_tokens_and_sequence_output():
  img = jax.random.normal(jax.random.key(2), (2, 8, 8))
  m = _model(name="lstm", hidden=8, out=10, num_layers=2, seq_len=8)
  v = jax.jit(lambda: m.init(jax.random.key(1), img, train=False))()
  f = jax.jit(lambda x: m.apply(v, x, train=False))
  y = f(img)
  assert y.shape == (2, 10) and bool(jnp.isfinite(y).all())
  np.testing.assert_allclose(f(img.reshape(2, 64)), y, atol=1e-6)
  np.testing.assert_allclose(f(img[..., None]), y, atol=1e-6)
  lm = _model(name="rnn", cell="lstm", hidden=8, out=30, vocab_size=30, embed_dim=8,
              seq_output=True)
  tok = jax.random.randint(jax.random.key(3), (2, 7), 0, 30)
  vl = jax.jit(lambda: lm.init(jax.random.key(1), tok, train=False))()
  assert jax.jit(lambda: lm.apply(vl, tok, train=False))().shape == (2, 7, 30)
  with pytest.raises(ValueError, match="expected one of"):
    gru = _model(name="rnn", cell="gru")
    jax.eval_shape(lambda: gru.init(jax.random.key(0), X, train=False))
