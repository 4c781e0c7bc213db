"""The reference jaxdl's Hugging Face support is held to: tiny random models that transformers
builds and saves inside the tests, and what transformers computes on them.

`save(name, directory)` writes what `save_pretrained` writes for the family `name` of `FAMILIES`
(config.json and model.safetensors, or shards and model.safetensors.index.json) and returns the
transformers model; `logits`, `greedy` and `generate` are transformers' answers on it. The tests
compare jaxdl's import, decoding, evaluation and export against these, and reload jaxdl's exports
with transformers (`load`).

Weights are drawn wider than transformers' init (std 0.15, norm gains 1 + 0.1 noise, biases
random) so the logits are far from uniform and every tensor, the biases and norm weights too,
changes the output. Attention runs transformers' "eager" path: the plain softmax(QK^T)V in fp32.
`conftest.hf_model` caches one saved directory per family, settings and worker.

Beside the models: `TOKENIZED_LLAMA`, the llama the CLI tests share, and `CHAT_LLAMA`, the same
as a chat model comes from the Hub (the fine-tuning and export tests); transformers' RoPE
frequencies (`rope_reference`, `ROPE_CASES`), strided perplexity (`strided_nll`) and
lm-evaluation-harness's multiple-choice scoring (`score_choices`), the numbers `jaxdl eval` and
the RoPE import are held to. torch and transformers are imported by the first call that needs
them (`_tf`), so importing this module (to parametrize over `FAMILIES`) costs nothing.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

# Shared by every family: a 2-layer, 32-wide model over 96 ids and 64 positions, no special ids
# (a test that needs them sets them).
SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, bos_token_id=None,
             eos_token_id=None, pad_token_id=None)

# name: (config class, model class, the family's own fields). One entry per family or variant
# jaxdl imports; the tests of each family name it here.
FAMILIES = {
    # Untied head, grouped-query (4 heads, 2 key/value heads), rope_theta 5e5.
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM",
                   dict(num_key_value_heads=4, tie_word_embeddings=True)),
    # Llama 3.1's RoPE (its band factors, the pretraining context scaled down to 16 of 64) and
    # heads of 16 features where hidden / heads is 8.
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, rope_parameters={
                        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16})),
    # A sliding window of 16 below its 64 positions.
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(num_key_value_heads=2, sliding_window=16, tie_word_embeddings=False)),
    # Query/key/value biases, one key/value head.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(num_key_value_heads=1, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Per-head q/k RMSNorm, head_dim 16, no biases, tied head, and YaRN (factor 4 over 16
    # pretraining positions: the ramp and the attention factor 0.1 ln 4 + 1 both act).
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                    "original_max_position_embeddings": 16})),
    # Qwen2's mix of windowed and full layers (window 8): layers 0 and 2 full, 1 windowed.
    "qwen2_mixed": ("Qwen2Config", "Qwen2ForCausalLM",
                    dict(num_hidden_layers=3, num_key_value_heads=2, tie_word_embeddings=False,
                         use_sliding_window=True, sliding_window=8, layer_types=[
                             "full_attention", "sliding_attention", "full_attention"])),
    # Gemma 1: (1 + w) RMSNorm, tanh-GeGLU, embeddings times sqrt(32), multi-query heads of 16
    # features (hidden / heads = 8), tied head.
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(num_key_value_heads=1, head_dim=16, rope_parameters={
                  "rope_type": "default", "rope_theta": 1e4})),
    # Gemma 2: sandwich norms, queries scaled by 24^-1/2 (not 16's), attention logits capped at
    # 4 and output logits at 6 (both act on these weights), local (window 8) / global layers.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                    query_pre_attn_scalar=24, attn_logit_softcapping=4.0,
                    final_logit_softcapping=6.0, sliding_window=8)),
    # Gemma 3 text: q/k norms with (1 + w), local layers (window 8, RoPE base 1e4) twice per
    # global one (RoPE base 1e6, linear scaling 4).
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                    query_pre_attn_scalar=12, sliding_window=8, layer_types=[
                        "sliding_attention", "sliding_attention", "full_attention"],
                    rope_parameters={
                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                        "full_attention": {"rope_type": "linear", "rope_theta": 1e6,
                                           "factor": 4.0}})),
    # Phi-3: fused qkv_proj and gate_up_proj, LongRoPE over a pretraining context of 16 of 64
    # positions (factor 4: attention factor sqrt(1 + ln 4 / ln 16)); short factors up to 16
    # tokens, long past them: a 24-token batch and a 4 + 16-token generation cross it.
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(num_key_value_heads=2, tie_word_embeddings=False,
                  original_max_position_embeddings=16, rope_parameters={
                      "rope_type": "longrope", "rope_theta": 10000.0,
                      "short_factor": [1.0, 1.3, 1.9, 2.6], "long_factor": [1.2, 2.5, 7.0, 19.0]})),
    # Phi-4-mini: Phi-3 with three quarters of each head's 8 features rotated (6: 3 pairs, 3
    # factors each), a tied head, LongRoPE as above.
    "phi4_mini": ("Phi3Config", "Phi3ForCausalLM",
                  dict(num_key_value_heads=1, tie_word_embeddings=True, partial_rotary_factor=0.75,
                       original_max_position_embeddings=16, rope_parameters={
                           "rope_type": "longrope", "rope_theta": 10000.0,
                           "partial_rotary_factor": 0.75, "short_factor": [1.0, 1.5, 2.2],
                           "long_factor": [1.4, 5.0, 16.0]})),
    # Llama's biases on q, k, v, o (attention_bias) and gate, up, down (mlp_bias).
    "llama_bias": ("LlamaConfig", "LlamaForCausalLM",
                   dict(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True,
                        mlp_bias=True)),
    # Dynamic NTK RoPE past max_position_embeddings 16 (factor 2: jaxdl's context 32): a 24-token
    # batch and a 4 + 16-token generation cross it.
    "llama_dynamic": ("LlamaConfig", "LlamaForCausalLM",
                      dict(num_key_value_heads=2, tie_word_embeddings=False,
                           max_position_embeddings=16, rope_parameters={
                               "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    # Linear RoPE scaling (positions / 4), multi-head.
    "llama_linear": ("LlamaConfig", "LlamaForCausalLM",
                     dict(num_key_value_heads=4, tie_word_embeddings=False, rope_parameters={
                         "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    # SmolLM's many-group GQA: 9 query heads of 8 features over 3 key/value heads, tied head.
    "smollm": ("LlamaConfig", "LlamaForCausalLM",
               dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3,
                    tie_word_embeddings=True)),
}


# The llama that the generate, eval, export and fine-tuning tests share: its 64-id BPE
# tokenizer.json beside it ('<unk>' 0, '<s>' 1, '</s>' 2) and its weights in 5 shards of at most
# 20 KB with model.safetensors.index.json, as large checkpoints come.
TOKENIZED_LLAMA = dict(tokenizer=True, max_shard_size="20KB")
# The same as a chat model comes from the Hub: bos / eos ids 1 / 2 in config.json and
# generation_config.json, and transformers' own tokenizer files (tokenizer_config.json with
# '<s>' / '</s>' / '<unk>', chat_template.jinja holding CHAT_TEMPLATE: each turn is '<s>', the
# role, a space, the text and '</s>').
CHAT_LLAMA = dict(tokenizer="chat", max_shard_size="20KB", bos_token_id=1, eos_token_id=2)
CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }} {{ m['content'] }}"
                 "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}{{ bos_token }}"
                 "assistant {% endif %}")


def _tf():
  """(torch, transformers), imported on first use."""
  import torch
  import transformers
  transformers.logging.disable_progress_bar()
  transformers.logging.set_verbosity_error()
  return torch, transformers


def build(name: str, seed: int = 0, **fields):
  """A random transformers model of family `name` (fields override `SIZES` and the family's)."""
  torch, transformers = _tf()
  config_cls, model_cls, extra = FAMILIES[name]
  torch.manual_seed(seed)
  config = getattr(transformers, config_cls)(**{**SIZES, **extra, **fields})
  config._attn_implementation = "eager"
  model = getattr(transformers, model_cls)(config).eval()
  # Gemma's norms scale by (1 + w): their w is drawn around 0, so every family's gain is ~1.
  unit = 0.0 if config.model_type.startswith("gemma") else 1.0
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if "norm" in pname:
        p.copy_(unit + 0.1 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  return model


def save(name: str, directory: str, seed: int = 0, max_shard_size: str | None = None,
         **fields):
  """`build(name, seed, **fields)` saved to `directory` by `save_pretrained`; returns the model."""
  model = build(name, seed, **fields)
  kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(directory, **kw)
  return model


def load(directory: str):
  """transformers' own load of a saved (or jaxdl-exported) directory, fp32, eager attention."""
  torch, transformers = _tf()
  return transformers.AutoModelForCausalLM.from_pretrained(
      directory, dtype=torch.float32, attn_implementation="eager").eval()


def logits(model, tokens_BxT, attention_mask=None) -> np.ndarray:
  """transformers' fp32 logits (B, T, V) on integer tokens."""
  torch, _ = _tf()
  with torch.no_grad():
    kw = {} if attention_mask is None else {"attention_mask": torch.as_tensor(attention_mask)}
    return model(torch.as_tensor(np.asarray(tokens_BxT)), **kw).logits.float().numpy()


def greedy(model, prompt_BxP, n: int, attention_mask=None, eos=None,
           pad: int = 0) -> tuple[np.ndarray, float]:
  """transformers' greedy `generate`: (prompt and n new tokens (B, P + n), the smallest top-1
  minus top-2 logit over its choices). With eos None every row makes n tokens; a row that met
  eos is padded with `pad` after it. The margin says how far a port matching the logits to 1e-5
  is from picking another token."""
  torch, _ = _tf()
  prompt = torch.as_tensor(np.asarray(prompt_BxP))
  mask = torch.ones_like(prompt) if attention_mask is None else torch.as_tensor(attention_mask)
  with torch.no_grad():
    res = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=n,
                         min_new_tokens=0 if eos is not None else n, eos_token_id=eos,
                         pad_token_id=pad, return_dict_in_generate=True, output_logits=True)
  top2 = torch.topk(torch.stack(res.logits).float(), 2, dim=-1).values
  return res.sequences.numpy(), float((top2[..., 0] - top2[..., 1]).min())


def write_tokenizer(path: str) -> None:
  """A 64-id BPE over letters (Metaspace, as Llama's sentencepiece tokenizers), '<unk>', '<s>'
  and '</s>' special: a vocabulary below the families' 96 ids."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  text = ["the quick brown fox jumps over the lazy dog", "a tiny model reads the text",
          "she sells sea shells by the sea shore"] * 20
  trainer = trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", "<s>", "</s>"],
                                show_progress=False)
  tok.train_from_iterator(text, trainer)
  assert tok.get_vocab_size() <= 64, tok.get_vocab_size()
  tok.save(path)


def saved(name: str, root: str, seed: int = 0, tokenizer: bool | str = False, **kw) -> str:
  """`save(name, seed, **kw)` into a directory of root named for the family and these settings
  (once: a directory already there is reused), plus `write_tokenizer`'s tokenizer.json when
  asked (tokenizer="chat": saved by transformers as `CHAT_LLAMA` says); returns the
  directory."""
  settings = repr((seed, tokenizer, sorted(kw.items())))
  tag = "" if settings == repr((0, False, [])) else "-" + hashlib.sha1(
      settings.encode()).hexdigest()[:8]
  directory = os.path.join(root, name + tag)
  if not os.path.exists(os.path.join(directory, "config.json")):
    save(name, directory, seed, **kw)
    if tokenizer:
      write_tokenizer(os.path.join(directory, "tokenizer.json"))
    if tokenizer == "chat":
      _, transformers = _tf()
      tok = transformers.PreTrainedTokenizerFast(
          tokenizer_file=os.path.join(directory, "tokenizer.json"), bos_token="<s>",
          eos_token="</s>", unk_token="<unk>")
      tok.chat_template = CHAT_TEMPLATE
      tok.save_pretrained(directory)
  return directory


def tokenizer(directory: str):
  """transformers' `AutoTokenizer` of a directory; a bare tokenizer.json (no
  tokenizer_config.json) is read as `PreTrainedTokenizerFast`, as transformers loads one."""
  _, transformers = _tf()
  if not os.path.exists(os.path.join(directory, "tokenizer_config.json")):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(directory, "tokenizer.json"))
  return transformers.AutoTokenizer.from_pretrained(directory)


# transformers' RoPE frequencies: configs of each type jaxdl imports, at real checkpoints' sizes.
ROPE_CASES = {
    "default": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "llama3": dict(rope_parameters={  # Llama 3.1 8B's
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        max_position_embeddings=131072),
    "llama3_v4": dict(rope_theta=500000.0, rope_scaling={  # the same, as transformers 4 wrote it
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, head_dim=64, max_position_embeddings=131072),
    "yarn": dict(rope_parameters={  # Qwen3's documented YaRN
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
        "original_max_position_embeddings": 32768}, max_position_embeddings=131072),
    "yarn_betas_attention": dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 16.0,
        "beta_slow": 2.0, "attention_factor": 1.5, "original_max_position_embeddings": 4096},
        max_position_embeddings=32768),
    "yarn_mscale": dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707,
        "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        max_position_embeddings=163840),
    "yarn_no_original": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                              "factor": 2.0}, max_position_embeddings=2048),
}


def rope_reference(fields: dict) -> tuple[dict, np.ndarray, float]:
  """(the config.json dict, transformers' inverse frequencies (head_dim / 2,) float32, its
  attention scaling) of a Llama config of 32 heads of 128 features with `fields`: what
  `LlamaRotaryEmbedding` runs, checked equal to `ROPE_INIT_FUNCTIONS[rope_type]` itself."""
  torch, transformers = _tf()
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  cfg = {**dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=64, num_hidden_layers=1, vocab_size=8,
                max_position_embeddings=8192, head_dim=128), **fields}
  config = transformers.LlamaConfig(**cfg)
  kind = config.rope_parameters["rope_type"]
  rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
  inv_freq, scaling = rotary.inv_freq, rotary.attention_scaling
  if kind != "default":  # the default type's function is the rotary module's own method
    init_freq, init_scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    assert torch.equal(init_freq, inv_freq) and init_scaling == scaling, fields
  return dict(cfg, model_type="llama"), inv_freq.numpy(), float(scaling)


def strided_nll(model, ids: list[int], context: int, stride: int) -> tuple[float, int]:
  """transformers' strided perplexity loop (its docs' "Perplexity of fixed-length models"): a
  window of up to context + 1 tokens every `stride`, scoring only the targets past the previous
  window's end, log-softmax in float64 of the fp32 logits; (summed NLL, targets scored)."""
  torch, _ = _tf()
  ids_t = torch.tensor([ids])
  total, count, prev_end = 0.0, 0, 0
  with torch.no_grad():
    for begin in range(0, len(ids), stride):
      end = min(begin + context + 1, len(ids))
      window = ids_t[:, begin:end]
      logp = torch.log_softmax(model(window[:, :-1]).logits.double(), -1)[0]
      nll_t = -logp.gather(-1, window[0, 1:, None])[:, 0]
      new = end - 1 - prev_end  # the window's last `new` targets were not scored before
      total += float(nll_t[-new:].sum())
      count += new
      prev_end = end - 1
      if end == len(ids):
        break
  return total, count


def encode_pair(tok, context: str, choice: str) -> tuple[list[int], list[int]]:
  """lm-evaluation-harness's split of context and continuation ids (trailing spaces of the
  context move to the continuation; the context's ids are a prefix of the whole's)."""
  n_spaces = len(context) - len(context.rstrip())
  if n_spaces:
    context, choice = context[:-n_spaces], context[-n_spaces:] + choice
  whole = tok.encode(context + choice, add_special_tokens=False)
  n = len(tok.encode(context, add_special_tokens=False))
  return whole[:n], whole[n:]


def score_choices(model, tok, items: list[dict]) -> dict:
  """lm-evaluation-harness's multiple choice with transformers: each choice's summed
  log-likelihood given its context (`encode_pair`); acc the share of items whose likeliest
  choice is the answer, acc_norm the same with each log-likelihood divided by the choice's
  length in UTF-8 bytes. {'loglikelihoods', 'acc', 'acc_norm'}."""
  torch, _ = _tf()
  lls, acc, acc_norm = [], 0, 0
  with torch.no_grad():
    for item in items:
      ll = []
      for choice in item["choices"]:
        c, x = encode_pair(tok, item["context"], choice)
        logp = torch.log_softmax(model(torch.tensor([c + x])).logits.double(), -1)[0]
        ll.append(float(sum(logp[len(c) - 1 + j, t] for j, t in enumerate(x))))
      lls.append(ll)
      n_bytes = np.array([len(a.encode("utf-8")) for a in item["choices"]], np.float64)
      acc += int(np.argmax(ll)) == item["answer"]
      acc_norm += int(np.argmax(np.array(ll) / n_bytes)) == item["answer"]
  return {"loglikelihoods": lls, "acc": acc / len(items), "acc_norm": acc_norm / len(items)}
