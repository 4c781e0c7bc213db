"""jaxdl.train.batched_draws: a run's initial state with its random draws hashed together is
bit-identical to the plain init's, on one device and sharded, with fewer Threefry calls."""

import jax
import numpy as np
import pytest
from jax.extend import core as jcore

from jaxdl.config import load_config
from jaxdl.train import batched_draws, build

# A U-Net (conv, norm, class embedding), an MLP with BatchNorm and a scanned GPT (its layers'
# draws batched inside the scan's body). A ViT, a DiT, the VAE's two nets and nine more configs
# also matched when written (session 22's note).
EXPERIMENTS = ["edm_digits:smoke", "moons_mlp:bn,smoke", "char_gpt:smoke"]


def _threefry_calls(jaxpr) -> int:
  """Threefry equations in `jaxpr`, its jit calls' and its loops' bodies included."""
  n = 0
  for e in jaxpr.eqns:
    n += e.primitive.name == "threefry2x32"
    for p in e.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else [p]):
        if isinstance(sub, (jcore.ClosedJaxpr, jcore.Jaxpr)):
          n += _threefry_calls(getattr(sub, "jaxpr", sub))
  return n


def _plain_and_batched(run, shardings=None):
  traced = run._init_traced()  # pylint: disable=protected-access
  flat = None if shardings is None else traced.out_tree.flatten_up_to(shardings)
  keys = jax.tree.leaves(run.init_key)
  plain = jax.jit(jcore.jaxpr_as_fun(traced.jaxpr), out_shardings=flat)(*keys)
  return plain, jax.tree.leaves(run.init_state(shardings))


def test_the_jax_internals_it_uses_are_there():
  # Without them init still works, unbatched; this says the compile got slower and why.
  assert batched_draws.AVAILABLE


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_init_state_is_bit_identical_to_the_plain_init(experiment):
  run = build(load_config(experiment)[0])
  plain, batched = _plain_and_batched(run)
  assert len(plain) == len(batched)
  for a, b in zip(plain, batched):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b, err_msg=experiment)


def test_the_unet_init_hashes_in_a_few_calls():
  """edm_digits' U-Net: 136 Threefry calls (one per key fold-in, split and draw) become 3, one per
  wave (a module's key is its parent's folded with its name; a draw needs its module's key)."""
  traced = build(load_config("edm_digits:smoke")[0])._init_traced()  # pylint: disable=protected-access
  keys = jax.tree.leaves(jax.random.split(jax.random.PRNGKey(0))[0])
  fn = batched_draws.batch_draws(traced.jaxpr)
  before = _threefry_calls(jax.make_jaxpr(
      lambda *k: batched_draws._expand(traced.jaxpr.jaxpr, traced.jaxpr.consts, *k))(*keys).jaxpr)
  after = _threefry_calls(jax.make_jaxpr(fn)(*keys).jaxpr)
  assert before >= 100 and after <= 4, (before, after)


def test_a_sharded_init_is_bit_identical_and_keeps_its_shardings():
  """FSDP over the session's four devices: each leaf where the strategy puts it, with the plain
  init's numbers (large draws keep their own call, so they stay partitionable)."""
  run = build(load_config("char_gpt:smoke", ["parallel.strategy='fsdp'", "parallel.fsdp=4",
                                              "parallel.devices=4", "model.d_model=256",
                                              "model.scan_layers=False"])[0])
  shardings = run.strategy.state_shardings(run.abstract_state())
  plain, batched = _plain_and_batched(run, shardings)
  assert max(a.size for a in plain) > batched_draws.MAX_BATCHED  # some draw keeps its call
  for a, b in zip(plain, batched):
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (a.sharding, b.sharding)
    np.testing.assert_array_equal(a, b)


def test_a_function_of_the_key_batched_draws_the_same_state():
  """`batched(fn)`, as the augmentation claim compiles digits_cnn's init for each seed's key."""
  run = build(load_config("digits_cnn:subset")[0])
  for seed in (0, 3):
    key = jax.random.PRNGKey(seed)
    plain = jax.jit(run.init_fn())(key)
    batched = jax.jit(batched_draws.batched(run.init_fn()))(key)
    assert jax.tree.structure(plain) == jax.tree.structure(batched)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(batched)):
      np.testing.assert_array_equal(a, b)
