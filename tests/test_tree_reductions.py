"""jaxdl.optim.tree_reductions: the chunked reductions equal the per-leaf ones, and sharded state
is reduced leaf by leaf."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.optim import tree_reductions
from jaxdl.train import mesh


def _tree(n=70, seed=0):
  """n small float32 leaves of assorted shapes (more than two chunks), one too large to be
  concatenated, a bfloat16 and an int leaf."""
  rng = np.random.default_rng(seed)
  tree = {f"w{i}": jnp.asarray(rng.normal(size=(i % 5 + 1, 3)), jnp.float32) for i in range(n)}
  tree["big"] = jnp.asarray(rng.normal(size=(tree_reductions.SMALL_LEAF + 1,)), jnp.float32)
  tree["half"] = jnp.asarray(rng.normal(size=(4,)), jnp.bfloat16)
  tree["count"] = jnp.asarray(7, jnp.int32)
  return tree


def test_global_norm_equals_optax_and_the_per_leaf_norm():
  tree = _tree()
  want = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                     for k, x in tree.items() if k != "count"))
  np.testing.assert_allclose(jax.jit(tree_reductions.global_norm)(tree), want, rtol=1e-6)
  floats = {k: v for k, v in tree.items() if k not in ("count", "half")}
  np.testing.assert_allclose(jax.jit(tree_reductions.global_norm)(floats),
                             optax.tree.norm(floats), rtol=1e-6)
  with tree_reductions.per_leaf():
    np.testing.assert_allclose(jax.jit(lambda t: tree_reductions.global_norm(t))(tree), want,
                               rtol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("leaf", ["w0", "w33", "w69", "big", "half"])
def test_all_finite_finds_one_bad_element_in_any_leaf_and_chunk(bad, leaf):
  tree = _tree()
  assert bool(jax.jit(tree_reductions.all_finite)(tree))
  tree[leaf] = tree[leaf].at[0].set(bad)
  assert not bool(jax.jit(tree_reductions.all_finite)(tree))
  with tree_reductions.per_leaf():
    assert not bool(jax.jit(lambda t: tree_reductions.all_finite(t))(tree))
  assert bool(tree_reductions.all_finite({"count": jnp.int32(1)}))  # no floating leaf


@pytest.mark.parametrize("scale", [0.01, 100.0])  # below the threshold (unchanged) and above
def test_clip_by_global_norm_equals_optax(scale):
  grads = {k: v * scale for k, v in _tree().items() if k not in ("count", "half")}
  ours, theirs = tree_reductions.clip_by_global_norm(1.0), optax.clip_by_global_norm(1.0)
  got, _ = jax.jit(ours.update)(grads, ours.init(grads))
  want, _ = jax.jit(theirs.update)(grads, theirs.init(grads))
  for k in grads:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-9)
  assert ours.init(grads) == theirs.init(grads)  # the same (empty) state in checkpoints


def _concatenates(fn, *args) -> int:
  return str(jax.make_jaxpr(fn)(*args)).count("concatenate")


def test_only_small_leaves_are_concatenated():
  """70 small float32 leaves make 3 concatenations (32 + 32 + 6 leaves); the large leaf, like
  the lone bfloat16 one, is reduced on its own, in no concatenation."""
  jaxpr = jax.make_jaxpr(tree_reductions.all_finite)(_tree())
  sizes = [eqn.outvars[0].aval.size for eqn in jaxpr.eqns if eqn.primitive.name == "concatenate"]
  assert len(sizes) == 3 and max(sizes) <= 32 * 15 < tree_reductions.SMALL_LEAF


def test_the_fsdp_strategy_traces_its_step_leaf_by_leaf():
  """Concatenating leaves that live on different devices would gather them: under FSDP (and
  tensor parallelism, its subclass) the step's reductions are per leaf."""
  tree = _tree(n=8)

  def step(state, batch):
    del batch
    return state, {"norm": tree_reductions.global_norm(state),
                   "finite": tree_reductions.all_finite(state)}

  assert _concatenates(step, tree, None) == 2
  strategy = mesh.MeshStrategy("fsdp", jax.devices()[:2], fsdp=2)
  traced = {}

  # What the strategy hands jax.jit, recorded.
  def jit(fn, **options):
    del options
    traced["fn"] = fn
    return fn

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(mesh.jax, "jit", jit)
    strategy.compile_train(step, tree)
  assert _concatenates(traced["fn"], tree, None) == 0


def test_sum_of_squares_per_row_of_a_stacked_axis():
  """rows=True: one sum per index of the leading axis all leaves share (a scanned stack)."""
  rng = np.random.default_rng(1)
  stack = {f"w{i}": jnp.asarray(rng.normal(size=(3, i % 4 + 1, 2)), jnp.float32)
           for i in range(40)}
  want = sum(np.sum(np.square(np.asarray(x, np.float64)), axis=(1, 2)) for x in stack.values())
  rows = jax.jit(lambda t: tree_reductions.sum_of_squares(t, rows=True))
  np.testing.assert_allclose(rows(stack), want, rtol=1e-6)
  with tree_reductions.per_leaf():  # a new function: jit caches traces by function, not flag
    np.testing.assert_allclose(jax.jit(lambda t: tree_reductions.sum_of_squares(t, rows=True))(
        stack), want, rtol=1e-6)
