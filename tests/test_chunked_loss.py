"""The chunked `lm` loss (`train.loss_chunk`, `jaxdl.train.chunked_loss`): the same loss,
metrics and parameter gradient as the plain loss over the full B x T x V logits, computed the
other way (per chunk of positions, logits recomputed in the backward), in fp32 to 1e-6; tied and
untied heads, a loss mask, the z-loss, packed documents, a T the chunk does not divide and a
logit soft-cap (Gemma 2's)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxdl import models
from jaxdl.schema import ConfigError
from jaxdl.train.tasks import make_task

B, T = 2, 15


def _task(chunk: int, model: str = "gpt", task: str = "lm", z_loss: float = 1e-3, **fields):
  return make_task(ml_collections.ConfigDict(
      {"task": task, "model": {"name": model, **fields},
       "train": {"loss_chunk": chunk, "z_loss": z_loss}}))


def _loss_and_grad(tie: bool, chunk: int, batch: dict, softcap: float = 0.0):
  model = models.build_model(models.gpt_config("tiny", tie_embeddings=tie, logit_softcap=softcap))
  params = model.init(jax.random.key(0), batch["x"], train=False)["params"]
  rngs = {"dropout": jax.random.key(1)}

  def value_and_grad(task):
    def loss(p):
      value, (metrics, _) = task.loss_fn(model.apply, p, {}, batch, rngs, True)
      return value, metrics
    return jax.value_and_grad(loss, has_aux=True)(params)

  cap = {"logit_softcap": softcap}
  return jax.jit(lambda: (value_and_grad(_task(0, **cap)), value_and_grad(_task(chunk, **cap))))()


def _batch(packed: bool) -> dict:
  tok_BxT1 = jax.random.randint(jax.random.key(2), (B, T + 1), 0, 64)
  batch = {"x": tok_BxT1[:, :-1], "y": tok_BxT1[:, 1:]}
  if packed:  # documents whose boundaries fall inside chunks
    seg_BxT = jnp.asarray([[1] * 6 + [2] * 9, [1] * 11 + [2] * 4])
    pos_BxT = jnp.asarray([[*range(6), *range(9)], [*range(11), *range(4)]])
    batch.update(segment_ids=seg_BxT, positions=pos_BxT)
  else:
    batch["loss_mask"] = (jnp.arange(T)[None] >= jnp.asarray([[3], [9]])).astype(jnp.int32)
  return batch


@pytest.mark.parametrize("tie,chunk,packed,softcap", [(True, 4, False, 0.0), (False, 5, True, 0.0),
                                                      (False, 4, False, 0.02)])
def test_chunked_loss_equals_plain_loss_and_gradient(tie, chunk, packed, softcap):
  ((l0, m0), g0), ((l1, m1), g1) = _loss_and_grad(tie, chunk, _batch(packed), softcap)
  if softcap:  # the cap acts: the loss differs from the uncapped model's
    assert abs(float(l0) - float(_loss_and_grad(tie, 0, _batch(packed))[0][0][0])) > 1e-3
  assert np.isfinite(float(l0)) and float(l0) > 1.0  # a real CE of an untrained model (ln 64)
  np.testing.assert_allclose(l1, l0, rtol=0, atol=1e-6)
  for key in ("accuracy", "z_loss", "bits_per_byte"):
    np.testing.assert_allclose(m1[key], m0[key], rtol=0, atol=1e-6, err_msg=key)
  head = "wte" if tie else "lm_head"
  assert float(jnp.abs(jax.tree.leaves(g0[head])[0]).max()) > 1e-3  # the head is trained
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), g1, g0)


@pytest.mark.parametrize("task,model", [("lm", "rnn"), ("classification", "gpt")])
def test_chunk_without_gpt_lm_is_refused_in_one_line(task, model):
  with pytest.raises(ConfigError, match=r"^train.loss_chunk: chunks the lm task's head .*"
                     r"set train.loss_chunk=0\)$"):
    _task(4, model=model, task=task, z_loss=0.0)
