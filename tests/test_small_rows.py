"""The course's small architecture rows: average and global average pooling in the CNN, input
dropout in the MLP, DropPath in the transformer block, MAE and Huber regression losses, and the
BatchNorm guard for training statistics over one value per feature."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.models import build_model
from jaxdl.models.gpt import GPT
from jaxdl.models.transformer import Block
from jaxdl.train.tasks import TASKS


def _model(**fields):
  return build_model(ml_collections.ConfigDict(fields))


def test_cnn_average_and_global_average_pooling():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 4, 4, 1)).astype(np.float32)
  for global_pool in (False, True):
    model = _model(name="cnn", features=(3,), kernel=1, pool=2, pool_type="avg", hidden=0, out=2,
                   global_pool=global_pool)
    v = model.init(jax.random.PRNGKey(0), x, train=False)
    p = jax.tree.map(np.asarray, v["params"])
    h = np.maximum(x @ p["conv_0"]["kernel"][0, 0] + p["conv_0"]["bias"], 0.0)  # 1x1 conv
    pooled = h.reshape(2, 2, 2, 2, 2, 3).mean(axis=(2, 4))                       # 2x2 means
    feats = pooled.mean(axis=(1, 2)) if global_pool else pooled.reshape(2, -1)
    want = feats @ p["head"]["kernel"] + p["head"]["bias"]
    np.testing.assert_allclose(model.apply(v, x, train=False), want, rtol=1e-5, atol=1e-6)
  # Global pooling makes the head independent of the image size: 8x8 images use the same params.
  assert model.apply(v, np.zeros((1, 8, 8, 1), np.float32), train=False).shape == (1, 2)
  with pytest.raises(ValueError, match="^model.pool_type"):
    _model(name="cnn", pool_type="median")


def test_mlp_input_dropout_is_inverted_dropout_on_x():
  model = _model(name="mlp", hidden=(), out=2000, input_dropout=0.5)
  x = np.linspace(1.0, 2.0, 2000, dtype=np.float32)[None]
  v = model.init(jax.random.PRNGKey(0), x, train=False)
  # With an identity head, y is the (dropped) input itself.
  v = {"params": {"head": {"kernel": jnp.eye(2000), "bias": jnp.zeros(2000)}}}
  np.testing.assert_array_equal(model.apply(v, x, train=False), x)
  y = np.asarray(model.apply(v, x, train=True, rngs={"dropout": jax.random.PRNGKey(1)}))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 2.0 * x[kept], rtol=1e-6)   # scaled by 1 / (1 - p)
  assert abs(kept.mean() - 0.5) < 0.05                             # 4.5 sigma at n = 2000


def test_drop_path_drops_whole_residual_branches_per_example():
  x = jax.random.normal(jax.random.PRNGKey(0), (256, 2, 8))
  block = Block(GPT(n_head=2, d_model=8, drop_path=0.5).block_spec)
  v = block.init(jax.random.PRNGKey(1), x)
  plain = Block(GPT(n_head=2, d_model=8).block_spec).apply(v, x)[0]
  np.testing.assert_array_equal(block.apply(v, x)[0], plain)      # eval: the identity
  y = np.asarray(block.clone(train=True).apply(v, x, rngs={"dropout": jax.random.PRNGKey(2)})[0])
  # Both branches dropped (probability p^2 = 1/4): the example passes through unchanged.
  identity = (y == np.asarray(x)).all(axis=(1, 2))
  assert 40 <= identity.sum() <= 88                                # mean 64, sd 6.9
  assert np.isfinite(y).all() and not (y == np.asarray(plain)).all(axis=(1, 2)).all()


def test_mae_and_huber_losses():
  batch = {"x": np.array([[-3.0], [-0.5], [0.0], [2.0]], np.float32), "y": np.zeros(4)}
  identity = lambda variables, x, train: x  # noqa: E731  the prediction is x itself
  for task, want in (("regression", (9 + 0.25 + 0 + 4) / 4), ("regression_mae", 5.5 / 4),
                     ("regression_huber", (2.5 + 0.125 + 0 + 1.5) / 4)):
    loss, _ = TASKS[task](None, None).loss_fn(identity, {}, {}, batch, {}, False)
    np.testing.assert_allclose(loss, want, rtol=1e-6)


def test_batchnorm_refuses_training_statistics_of_one_value():
  mlp = _model(name="mlp", hidden=(4,), norm="batch")
  v = mlp.init(jax.random.PRNGKey(0), np.ones((2, 3)), train=False)
  with pytest.raises(ValueError, match="^model.norm: BatchNorm in training mode over a batch "
                                       "of 1"):
    mlp.apply(v, np.ones((1, 3)), train=True, mutable=["batch_stats"])
  assert mlp.apply(v, np.ones((1, 3)), train=False).shape == (1, 1)  # eval: running averages
  y, _ = mlp.apply(v, np.arange(6.0).reshape(2, 3), train=True, mutable=["batch_stats"])
  assert np.isfinite(y).all()
  cnn = _model(name="cnn", features=(2,), hidden=0, norm="batch")  # H x W values per channel
  v = cnn.init(jax.random.PRNGKey(0), np.ones((1, 4, 4, 1)), train=False)
  y, _ = cnn.apply(v, np.random.default_rng(0).normal(size=(1, 4, 4, 1)), train=True,
                   mutable=["batch_stats"])
  assert np.abs(y).max() > 0


def test_batchnorm_batch_of_one_is_refused_before_the_workdir(tmp_path, capsys):
  workdir = tmp_path / "run"
  capsys.readouterr()
  code = cli.main(["train", "moons_mlp:bn,smoke", "--set", "data.batch_size=1", "--set",
                   "parallel.devices=1", "--workdir", str(workdir), "--no-progress"])
  lines = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and "model.norm: BatchNorm" in lines[0], lines
  assert not workdir.exists()
