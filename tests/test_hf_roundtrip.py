"""Every family of `hf_reference.FAMILIES` round trips through transformers.

For each family (a new entry there is tested here with no other change), a tiny random model that
transformers built and saved inside the test is imported with `jaxdl.models.hf.load_hf` and held
to transformers' own answers on it:

- logits within 1e-5 (fp32, absolute) on a fixed batch of 2 x 24 tokens (longer than Mistral's
  16-token window);
- 16 greedy tokens from jaxdl's KV-cached decoding (`jaxdl.models.decoding`) identical to
  transformers' `generate`, whose smallest top-1 minus top-2 logit over its choices must exceed
  the measured logit error and the 1e-5 tolerance (so a difference is a bug, not rounding);
- `save_hf`'s export reloaded by transformers (`hf_reference.load`): the same logits to 1e-5,
  and config.json's model_type the source's.

One test per family (so the parallel workers never build a family twice): one forward and one
decoding compile.
"""

import json

import hf_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.models import decoding, hf

TOL = 1e-5
NEW = 16


@pytest.mark.parametrize("name", sorted(hf_reference.FAMILIES))
def test_family_round_trips_through_transformers(name, hf_model, tmp_path):
  src = hf_model(name)
  ref = hf_reference.load(src)
  model, params = hf.load_hf(src)
  tokens_BxT = np.random.default_rng(0).integers(0, ref.config.vocab_size, (2, 24))

  # Logits on a fixed batch.
  want = hf_reference.logits(ref, tokens_BxT)
  ours = np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))(
      params, jnp.asarray(tokens_BxT, jnp.int32)))
  assert ours.shape == want.shape
  np.testing.assert_allclose(ours, want, atol=TOL, rtol=0, err_msg=f"{name}: logits")
  assert np.abs(want).max() > 0.5  # far from uniform: every tensor acts on the output

  # 16 greedy tokens, KV-cached, after a 4-token prompt.
  prompt_BxP = tokens_BxT[:, :4]
  theirs, margin = hf_reference.greedy(ref, prompt_BxP, NEW)
  err = float(np.abs(ours - want).max())
  assert margin > max(err, TOL), f"{name}: top-1/top-2 margin {margin} within the error {err}"
  out = decoding.generate(model, params, jnp.asarray(prompt_BxP, jnp.int32), jax.random.key(0),
                          NEW, temperature=0)
  assert theirs.shape == (2, 4 + NEW)
  np.testing.assert_array_equal(np.asarray(out), theirs, err_msg=f"{name}: greedy tokens")

  # The export, reloaded by transformers.
  hf.save_hf(str(tmp_path), model, params)
  with open(f"{src}/config.json", encoding="utf-8") as f:
    source_type = json.load(f)["model_type"]
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    assert json.load(f)["model_type"] == source_type, name
  back = hf_reference.load(str(tmp_path))
  np.testing.assert_allclose(hf_reference.logits(back, tokens_BxT), want, atol=TOL, rtol=0,
                             err_msg=f"{name}: the export's logits in transformers")
