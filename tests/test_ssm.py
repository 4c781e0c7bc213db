"""Selective state-space mixer: the parallel scan equals the step-by-step recurrence, segment ids
restart it (equal to separate runs; all-equal ids change nothing), the GPT with mixer='ssm'
decodes with a constant-size state to the full forward's logits (and a packed document's),
causality, and the bad state size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.data.packing import segment_positions
from jaxdl.models import build_model, gpt_config
from jaxdl.models.decoding import init_cache
from jaxdl.models.gpt import GPT
from jaxdl.models.ssm import SelectiveSSM

# Xavier init gives the mixer O(1) outputs, so a wrong state would show far above 1e-5.
TINY = dict(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=16, mixer="ssm",
            ssm_state=4, init_name="xavier")


@pytest.fixture(scope="module")
def mixer():
  """One mixer (d 8, N 4, Xavier), an input (2, 12, 8), its variables and the jitted scan,
  shared by the scan tests (one compile of the init and of each shape's scan)."""
  layer = SelectiveSSM(8, GPT(d_model=8, mixer="ssm", ssm_state=4, init_name="xavier").block_spec)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 12, 8))
  return layer, x, jax.jit(layer.init)(jax.random.PRNGKey(1), x), jax.jit(layer.apply)


def test_scan_equals_step_by_step_recurrence(mixer):
  layer, x, v, scan = mixer
  y_scan = scan(v, x)
  step = jax.jit(lambda v, x_t, h: layer.apply(v, x_t, h, method=layer.step))
  state = layer.apply(v, 2, method=layer.init_state)
  ys = []
  for t in range(12):
    y_t, state = step(v, x[:, t], state)
    ys.append(y_t)
  # (B, expand D, N) and (B, K - 1, expand D): the same size after 12 tokens as after 1.
  assert state[0].shape == (2, 16, 4) and state[1].shape == (2, 3, 16)
  np.testing.assert_allclose(np.stack(ys, 1), y_scan, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(y_scan).mean()) > 0.01  # 1,000x the tolerance: a wrong state would show
  # The recurrence carries information: dropping the state at t = 6 changes the output.
  y_late = scan(v, x[:, 6:])
  assert float(jnp.abs(y_late - y_scan[:, 6:]).max()) > 1e-3


def test_segment_ids_restart_the_scan_and_the_convolution(mixer):
  """Two segments of 5 and 7 tokens (longer than the K - 1 = 3 taps) scanned together equal
  each scanned alone from the zero state; one segment is the plain scan."""
  _, x, v, scan = mixer
  seg = jnp.broadcast_to(jnp.repeat(jnp.array([3, 4]), jnp.array([5, 7]), total_repeat_length=12),
                         (2, 12))
  y_packed = scan(v, x, segment_ids=seg)
  np.testing.assert_allclose(y_packed[:, :5], scan(v, x[:, :5]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y_packed[:, 5:], scan(v, x[:, 5:]), rtol=1e-5, atol=1e-6)
  y = scan(v, x)
  np.testing.assert_array_equal(scan(v, x, segment_ids=jnp.full((2, 12), 3)), y)
  assert float(jnp.abs(y_packed[:, 5:] - y[:, 5:]).max()) > 1e-2  # the reset matters


@pytest.fixture(scope="module")
def tiny_gpt():
  """TINY's GPT initialized once (key 3), its jitted forward and one-token decode, shared by the
  decoding tests (one compile of each)."""
  model = build_model(gpt_config("", **TINY))
  v = jax.jit(lambda k: model.init(k, jnp.zeros((2, 10), jnp.int32), train=False))(
      jax.random.PRNGKey(3))
  forward = jax.jit(lambda v, x: model.apply(v, x, train=False))
  # One token at a time from an empty state (pos traced: one compile for all steps).
  decode = jax.jit(lambda v, x_t, cache, pos: model.apply(v, x_t, train=False, cache=cache,
                                                           pos=pos))
  return model, v, forward, decode


def test_cached_decoding_of_a_document_equals_its_logits_packed(tiny_gpt):
  """Cached decoding continues one document: run from an empty cache it gives the second packed
  document's logits of the full forward with segment ids (a third computation)."""
  model, v, _, decode = tiny_gpt
  x = np.array(jax.random.randint(jax.random.PRNGKey(2), (2, 10), 0, 31))
  x[:, [0, 4]] = 31  # end-of-text 31 opens documents of 4 and 6 tokens
  seg, positions = segment_positions(x, 31)
  packed = jax.jit(lambda v, x: model.apply(v, x, train=False, segment_ids=seg,
                                            positions=positions))(v, x)
  cache, outs = init_cache(model, 2), []
  for t in range(4, 10):
    logits, cache = decode(v, x[:, t:t + 1], cache, jnp.int32(t - 4))
    outs.append(logits)
  np.testing.assert_allclose(np.concatenate(outs, 1), packed[:, 4:], rtol=1e-5, atol=1e-5)


def test_gpt_ssm_cached_decoding_equals_full_forward_and_is_causal(tiny_gpt):
  model, v, forward, decode = tiny_gpt
  x = jax.random.randint(jax.random.PRNGKey(2), (2, 10), 0, 32)
  full = forward(v, x)
  cache, outs = init_cache(model, 2), []
  for t in range(10):
    logits, cache = decode(v, x[:, t:t + 1], cache, jnp.int32(t))
    outs.append(logits)
  # (L, B, E, N) and (L, B, K - 1, E) whatever the length
  assert cache["h"].shape == (2, 2, 32, 4) and cache["conv"].shape == (2, 2, 3, 32)
  np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)
  # Causal: changing token 7 leaves the logits of positions 0..6 unchanged.
  y = forward(v, x.at[:, 7].set((x[:, 7] + 1) % 32))
  np.testing.assert_array_equal(y[:, :7], full[:, :7])
  assert float(jnp.abs(y[:, 7:] - full[:, 7:]).max()) > 1e-4


@pytest.mark.parametrize("key,value", [("ssm_state", 0), ("mixer", "rnn")])
def test_bad_ssm_config_is_one_line(key, value):
  with pytest.raises(ValueError, match=f"^model.{key}: ") as e:
    build_model(gpt_config("", **{**TINY, key: value}))
  assert "\n" not in str(e.value)


def test_ssm_state_zero_from_the_cli_is_one_line_exit_2(tmp_path, capsys):
  from jaxdl import cli
  argv = ["train", "char_gpt:smoke", "--workdir", str(tmp_path / "w"), "--no-progress",
          "--set", "model.mixer=ssm", "--set", "model.ssm_state=0"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "model.ssm_state" in err[0], err
  assert not (tmp_path / "w").exists()
