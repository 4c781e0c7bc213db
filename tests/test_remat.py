"""Rematerialization policies (`model.remat`, `jaxdl.models.transformer.REMAT_POLICIES`): each
policy recomputes a different part of the block in the backward pass, so each is a different
computation of the same gradient; a few Adam steps of a tiny GPT must reach the loss of 'none'."""

import jax
import numpy as np
import optax
import pytest

from jaxdl import cli, models
from jaxdl.models import transformer

TOK = jax.random.randint(jax.random.key(1), (2, 17), 0, 64)


def _train_losses(remat: str, steps: int = 3) -> np.ndarray:
  """The losses of `steps` SGD steps (lr 0.5) of the tiny GPT from one init."""
  model = models.build_model(models.gpt_config("tiny", remat=remat))
  params = model.init(jax.random.key(0), TOK[:, :-1], train=False)["params"]

  def loss_fn(p):
    logits_BxTxV = model.apply({"params": p}, TOK[:, :-1], train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, TOK[:, 1:]).mean()

  @jax.jit
  def run(p):
    def step(p, _):
      loss, g = jax.value_and_grad(loss_fn)(p)
      return jax.tree.map(lambda w, d: w - 0.5 * d, p, g), loss
    return jax.lax.scan(step, p, None, length=steps)[1]

  return np.asarray(run(params))


@pytest.fixture(scope="module")
def plain_losses():
  return _train_losses("none")


@pytest.mark.parametrize("policy", ["full", "dots", "dots_no_batch"])
def test_each_policy_trains_to_the_loss_of_none(policy, plain_losses):
  losses = _train_losses(policy)
  assert losses[-1] < losses[0]  # it trains
  np.testing.assert_allclose(losses, plain_losses, rtol=0, atol=1e-6)


def test_policies_are_the_jax_ones():
  assert transformer.REMAT_POLICIES["none"] is None
  assert transformer.REMAT_POLICIES["full"] is jax.checkpoint_policies.nothing_saveable
  assert (transformer.REMAT_POLICIES["dots_no_batch"]
          is jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)


@pytest.mark.parametrize("setting,expected", [
    ("model.remat='sometimes'", "model.remat: expected one of 'none', 'full', 'dots', "
                                "'dots_no_batch', 'offload', got 'sometimes'"),
    ("model.remat='offload'", "model.remat: 'offload' moves saved activations to host memory"),
    ("model.remat=true", "model.remat: is a policy name now ('none', 'full', 'dots', "
                         "'dots_no_batch', 'offload'); the old True is 'full', got 'true'"),
])
def test_bad_policy_is_one_line_exit_2_nothing_written(setting, expected, tmp_path, capsys):
  if "offload" in setting and jax.default_backend() != "cpu":
    pytest.skip("offload is refused only on the cpu backend")
  workdir = tmp_path / "run"
  capsys.readouterr()
  assert cli.main(["train", "char_gpt:smoke", "--set", setting, "--workdir", str(workdir),
                   "--no-progress"]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and expected in lines[0], lines
  assert not workdir.exists()


def test_old_boolean_names_its_new_spelling():
  with pytest.raises(models.ConfigError, match="model.remat: is a policy name now .*the old "
                     "True is 'full'"):
    models.build_model(models.gpt_config("tiny", remat=True))
