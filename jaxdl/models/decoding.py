"""Decoding a GPT: the KV cache, next-token sampling and generation as one jitted lax loop.

Shapes: B batch, P prompt length, N total length, S cache length, V vocab, L layers, H heads
(the cache holds the n_kv_head key/value heads), K head width.

Generation: the prompt fills the cache in one forward pass; each new token t_i is drawn from
p(t_i | t_<i) = softmax(logits_i / temperature), restricted to the top_k largest logits and to the
smallest set whose mass reaches top_p (temperature 0: the argmax), then fed back as one cached
decoding step (`make_generator`, what `jaxdl generate` runs). A batch of prompts is left-padded
(`left_pad`), each row's positions counted from its own first token; a row ends at its first
end-of-sequence id. Under LongRoPE (`jaxdl.models.rope`) the step whose token first takes the
sequence past the pretraining context L runs the whole sequence again (the long factors turn
every position, so the cached keys are stale), as transformers' Phi-3 `generate` does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.schema import ConfigError


def init_cache(model, batch_size: int, max_len: int | None = None, dtype=None) -> dict:
  """Zero KV cache {'k', 'v'} of shape (L, B, S, N, K), S = max_len (default block_size), N the
  key/value heads (n_kv_head; fewer than the H query heads under grouped-query attention); for
  mixer='ssm' the recurrent state {'h'} (L, B, E, N), fp32, and the convolution's last inputs
  {'conv'} (L, B, ssm_conv - 1, E), whatever the length."""
  if getattr(model, "mixer", None) == "ssm":
    e = model.ssm_expand * model.d_model
    return {"h": jnp.zeros((model.n_layer, batch_size, e, model.ssm_state), jnp.float32),
            "conv": jnp.zeros((model.n_layer, batch_size, model.ssm_conv - 1, e),
                              dtype or model.dtype)}
  s = max_len or model.block_size
  if model.pos == "learned" and s > model.block_size:
    raise ValueError(f"GPT: cache length {s} exceeds block_size {model.block_size}")
  shape = (model.n_layer, batch_size, s, model.kv_heads, model.head_width)
  z = jnp.zeros(shape, dtype or model.dtype)
  return {"k": z, "v": z}


def check_sampling(vocab_size: int, *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, names=("temperature", "top_k", "top_p")) -> None:
  """Refuses, in one line naming the setting (`names`: how the caller spells temperature, top_k,
  top_p), what `sample_logits` cannot draw with: a temperature that is not finite or < 0 (0 is
  greedy), a top_k outside 0 (all) .. vocab_size, a top_p outside (0, 1]. Checked from the sizes
  alone, before anything is allocated or compiled."""
  t_name, k_name, p_name = names
  if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
          and temperature >= 0):
    raise ConfigError(f"{t_name}: must be a finite number >= 0 (0: greedy), got {temperature!r}")
  if not (isinstance(top_k, int) and 0 <= top_k <= vocab_size):
    raise ConfigError(f"{k_name}: must be in 1..{vocab_size} (the model's vocabulary) or 0 "
                      f"(all tokens), got {top_k!r}")
  if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
    raise ConfigError(f"{p_name}: must be in (0, 1], got {top_p!r}")


def sample_logits(rng, logits_BxV, *, temperature=1.0, top_k: int = 0, top_p: float = 1.0):
  """Next tokens (B,) from logits: the argmax at temperature 0, else softmax(logits / temperature)
  sampled after keeping the top_k largest (top_k > 0) and the smallest set whose mass reaches
  top_p."""
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1)
  neg = jnp.finfo(jnp.float32).min
  logits_BxV = logits_BxV.astype(jnp.float32) / temperature
  if top_k > 0:
    kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth_Bx1, neg, logits_BxV)
  if top_p < 1.0:
    sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV  # keep while mass before it < p
    kept = jnp.where(mass_before < top_p, sorted_BxV, jnp.inf)
    cutoff_Bx1 = jnp.min(kept, axis=-1, keepdims=True)
    logits_BxV = jnp.where(logits_BxV < cutoff_Bx1, neg, logits_BxV)
  return jax.random.categorical(rng, logits_BxV, axis=-1)


def make_generator(model, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, eos_ids=(), pad_id: int = 0):
  """Returns jitted `generate(params, prompt_BxP, rng, start_B=None) -> tokens BxN`,
  N = P + max_new_tokens: text continuation (`jaxdl generate`); the Gaussian-path samplers are
  `jaxdl.generative.samplers.make_sampler`.

  Prompts of different lengths come left-padded: row b's prompt fills prompt[b, start_B[b]:]
  (start_B None: every row starts at 0), so every row's next token is drawn at index P. Its
  positions count from start_B[b] and nothing attends to the padding (`GPT`'s `start`), so each
  row continues as it would alone, and as transformers' `generate` with that attention mask.

  Args:
    model: a `GPT` (dropout is switched off for decoding).
    max_new_tokens: tokens appended after the prompt; P + N must fit in block_size for learned
      positions.
    temperature: logits are divided by it before the softmax; 0 takes the argmax (greedy).
    top_k: keep only the k largest logits, 1 <= k <= vocab_size (0: all).
    top_p: keep the smallest set of tokens whose probability mass reaches p (1.0: all).
    eos_ids: end-of-sequence ids: a row that draws one is finished, its later tokens are
      `pad_id` (what transformers writes), and the loop stops once every row is finished.
    pad_id: the id written after a row's end (and in the rows' unused tail).
  A bad value raises ConfigError (`check_sampling`) before anything is compiled.
  """
  check_sampling(model.vocab_size, temperature=temperature, top_k=top_k, top_p=top_p)
  model = model.clone(dropout=0.0, attn_dropout=0.0)
  eos_E = jnp.asarray(sorted({int(e) for e in eos_ids}) or [-1], jnp.int32)  # -1: never drawn

  @jax.jit
  def generate(params, prompt_BxP, rng, start_B=None):
    b, p = prompt_BxP.shape
    total = p + max_new_tokens
    if model.pos == "learned" and total > model.block_size:
      raise ValueError(f"generate: prompt {p} + {max_new_tokens} new tokens exceeds block_size "
                       f"{model.block_size}")
    cache = init_cache(model, b, total)
    logits, cache = model.apply({"params": params}, prompt_BxP, train=False, cache=cache, pos=0,
                                start=start_B)
    out_BxN = jnp.full((b, total), pad_id, prompt_BxP.dtype).at[:, :p].set(prompt_BxP)

    def one_token(i, out_BxN, cache):
      logits, cache = model.apply({"params": params}, out_BxN[:, p + i][:, None], train=False,
                                  cache=cache, pos=p + i, start=start_B)
      return logits[:, -1], cache

    spec = getattr(model, "rope_spec", None)
    switch = spec.original_max if spec is not None and spec.scaling == "longrope" else -1
    def refill(i, out_BxN, cache):  # the sequence just reached switch + 1 tokens: run it again
      del i, cache
      logits, cache = model.apply({"params": params}, out_BxN[:, :switch + 1], train=False,
                                  cache=init_cache(model, b, total), pos=0, start=start_B)
      return logits[:, -1], cache

    def step(carry):
      i, out_BxN, cache, last_BxV, done_B, rng = carry
      rng, sub = jax.random.split(rng)
      tok_B = sample_logits(sub, last_BxV, temperature=temperature, top_k=top_k,
                            top_p=top_p).astype(out_BxN.dtype)
      tok_B = jnp.where(done_B, pad_id, tok_B)
      done_B = done_B | jnp.isin(tok_B, eos_E)
      out_BxN = jax.lax.dynamic_update_slice(out_BxN, tok_B[:, None], (0, p + i))
      if p <= switch < total:  # static: the step feeding index `switch` refills
        last_BxV, cache = jax.lax.cond(p + i == switch, refill, one_token, i, out_BxN, cache)
      else:
        last_BxV, cache = one_token(i, out_BxN, cache)
      return i + 1, out_BxN, cache, last_BxV, done_B, rng

    def running(carry):
      return (carry[0] < max_new_tokens) & ~jnp.all(carry[4])

    carry = (jnp.int32(0), out_BxN, cache, logits[:, -1], jnp.zeros((b,), bool), rng)
    return jax.lax.while_loop(running, step, carry)[1]

  return generate


def generate(model, params, prompt_BxP, rng, max_new_tokens: int, *, start_B=None, **settings):
  """One-off convenience around `make_generator` (which callers should keep to reuse the jit)."""
  return make_generator(model, max_new_tokens, **settings)(params, prompt_BxP, rng, start_B)


def left_pad(rows: list, pad_id: int = 0):
  """(prompt_BxP int32, start_B int32): id lists of different lengths right-aligned in P =
  the longest, pad_id before them; start_B[b] the index where row b's ids begin."""
  p = max(len(r) for r in rows)
  prompt_BxP = np.full((len(rows), p), pad_id, np.int32)
  for b, r in enumerate(rows):
    prompt_BxP[b, p - len(r):] = r
  return prompt_BxP, np.asarray([p - len(r) for r in rows], np.int32)
