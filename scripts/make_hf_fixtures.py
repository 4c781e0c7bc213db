"""Writes tests/data/hf/<name>/: tiny random Hugging Face models and what `transformers` computes.

Run with a Python that has torch and transformers (not jaxdl's test environment, which has
neither):  python scripts/make_hf_fixtures.py [OUT_DIR]

Each directory is what `save_pretrained` writes (config.json, model.safetensors, or shards and
model.safetensors.index.json) plus expected.npz:
  tokens (B, T) int64     a fixed batch;  logits (B, T, V) fp32, transformers' logits on it
  prompt (B, P) int64     generated (B, P + N) int64, transformers' greedy `generate`
  margin ()               the smallest top-1 minus top-2 logit over the greedy steps, so a
                          port that matches the logits to 1e-5 must pick the same tokens
The models: llama (untied head, grouped-query 4 heads / 2 key-value heads, rope_theta 5e5,
sharded), llama_tied (tied embeddings, multi-head), mistral (sliding_window 16 below its 64
positions) and qwen2 (its query/key/value biases). Weights are drawn wider than the library's
init (std 0.15, norm weights 1 + 0.1 noise, biases random) so the logits are far from uniform
and every tensor, the biases and norm weights too, changes the output. llama also gets a
tokenizer.json (a 64-id BPE made with `tokenizers`, '</s>' its end of text).

`python scripts/make_hf_fixtures.py --eval [OUT_DIR]` writes only llama/eval.json from the
committed llama model: a 120-word text's summed NLL and perplexity under the strided windows of
`jaxdl eval` (`strided_nll`, transformers' documented loop, at strides 32 and 64 of its 64-token
context, the text after the '</s>' prefix), and 20 multiple-choice items with each choice's
log-likelihood, acc and acc_norm as lm-evaluation-harness computes them.

`--generation` (run after, on the committed llama, mistral and qwen2 directories, loaded with
`from_pretrained` so the weights stay as they are) adds generate.npz, batched greedy decoding as
`jaxdl generate` runs it:
  prompt (2, 12) int64, mask (2, 12)   row 0 twelve tokens, row 1 five pad ids (0) then seven
  generated (2, 28)        `generate(prompt, attention_mask=mask)`, 16 greedy tokens, no eos
  margin ()                the smallest top-1 minus top-2 logit over those 32 choices
  eos (), eos_generated    the same with eos_token_id = row 0's 4th new token: row 0 stops
                           there and is padded with 0 after, row 1 runs on unless it meets it
  long_tokens (2, 40), long_logits (mistral only)  a forward pass 2.5 times its window of 16
Mistral's 28 tokens of row 0 also run past its window, so cached decoding is checked there.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import transformers

SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, bos_token_id=None,
             eos_token_id=None, pad_token_id=None)
MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "llama_tied": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(num_key_value_heads=2, sliding_window=16, tie_word_embeddings=False)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(num_key_value_heads=1, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Llama 3.1's RoPE (its band factors, the pretraining context scaled down to 16 of 64) and
    # heads of 16 features where hidden / heads is 8.
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
               dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, rope_parameters={
                        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16})),
    # Qwen3: per-head q/k RMSNorm, head_dim 16, no biases, tied head, and YaRN (factor 4 over 16
    # pretraining positions: the ramp and the attention factor 0.1 ln 4 + 1 both act).
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                    "original_max_position_embeddings": 16})),
}
GREEDY = {"llama3": 16, "qwen3": 16}  # greedy tokens in expected.npz (N otherwise)
SHARDED = {"llama": "20KB"}
B, T, P, N = 2, 8, 4, 8


def build(name: str, seed: int):
  config_cls, model_cls, extra = MODELS[name]
  torch.manual_seed(seed)
  config = config_cls(**SIZES, **extra)
  model = model_cls(config).eval()
  model.config._attn_implementation = "eager"  # the plain softmax(QK^T)V in fp32
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if "norm" in pname:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  return model


def expected(model, seed: int, n: int = N) -> dict:
  g = torch.Generator().manual_seed(seed)
  v = model.config.vocab_size
  tokens = torch.randint(0, v, (B, T), generator=g)
  prompt = torch.randint(0, v, (B, P), generator=g)
  with torch.no_grad():
    logits = model(tokens).logits.float()
    # No end of text, and an explicit mask: else generate masks the prompt's pad_token_id ids.
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                         max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    # The same greedy decoding step by step, for the top-2 margins.
    ids, margin = prompt, np.inf
    for _ in range(n):
      last = model(ids).logits[:, -1].float()
      top2 = torch.topk(last, 2, dim=-1).values
      margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
      ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=-1)
  assert torch.equal(ids, out), (ids, out)
  return dict(tokens=tokens.numpy(), logits=logits.numpy(), prompt=prompt.numpy(),
              generated=out.numpy(), margin=np.float32(margin))


def write_tokenizer(path: str) -> None:
  """A 64-id BPE over letters (Metaspace, as Llama's sentencepiece tokenizers), '</s>' and '<s>'
  special: vocabulary below the llama fixture's 96 ids."""
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


def expected_generation(directory: str, name: str, seed: int) -> dict:
  """generate.npz of the model saved in `directory` (module docstring)."""
  model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
  model.config._attn_implementation = "eager"
  g = torch.Generator().manual_seed(seed)
  v = model.config.vocab_size
  prompt = torch.randint(1, v, (2, 12), generator=g)
  mask = torch.ones_like(prompt)
  prompt[1, :5], mask[1, :5] = 0, 0
  greedy = dict(do_sample=False, max_new_tokens=16, pad_token_id=0, return_dict_in_generate=True,
                output_logits=True)
  out = {"prompt": prompt.numpy(), "mask": mask.numpy()}
  with torch.no_grad():
    res = model.generate(prompt, attention_mask=mask, min_new_tokens=16, eos_token_id=None,
                         **greedy)
    out["generated"] = res.sequences.numpy()
    top2 = torch.topk(torch.stack(res.logits).float(), 2, dim=-1).values
    out["margin"] = np.float32((top2[..., 0] - top2[..., 1]).min())
    eos = int(res.sequences[0, 12 + 3])
    res = model.generate(prompt, attention_mask=mask, eos_token_id=eos, **greedy)
    out["eos"], out["eos_generated"] = np.int64(eos), res.sequences.numpy()
    if name == "mistral":
      out["long_tokens"] = torch.randint(0, v, (2, 40), generator=g).numpy()
      out["long_logits"] = model(torch.as_tensor(out["long_tokens"])).logits.float().numpy()
  return out


def main(out_root: str, only=None) -> None:
  torch.use_deterministic_algorithms(True)
  for seed, name in enumerate(MODELS):
    if only and name not in only:
      continue
    model = build(name, seed)
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
      os.remove(os.path.join(out, f))
    kw = {"max_shard_size": SHARDED[name]} if name in SHARDED else {}
    model.save_pretrained(out, **kw)
    exp = expected(model, 100 + seed, GREEDY.get(name, N))
    np.savez(os.path.join(out, "expected.npz"), **exp)
    if name == "llama":
      write_tokenizer(os.path.join(out, "tokenizer.json"))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: {sorted(os.listdir(out))}, {size / 1024:.0f} KiB, greedy margin "
          f"{exp['margin']:.4f}")


# `--eval`: what `jaxdl eval` must report on the committed llama model, computed here with
# transformers (its tokenizer and forward pass) and written to llama/eval.json.
EVAL_WORDS = ("the quick brown fox jumps over the lazy dog a tiny model reads the text she sells "
              "sea shells by the sea shore").split()
EVAL_STRIDES = (32, 64)


def strided_nll(model, ids: list[int], context: int, stride: int) -> tuple[float, int]:
  """Transformers' strided perplexity loop (its docs' "Perplexity of fixed-length models"): a
  window of up to context + 1 tokens every `stride`, scoring only the targets past the previous
  window's end; (summed NLL, targets scored)."""
  ids_t = torch.tensor([ids])
  total, count, prev_end = 0.0, 0, 0
  for begin in range(0, len(ids), stride):
    end = min(begin + context + 1, len(ids))
    window = ids_t[:, begin:end]
    logp = torch.log_softmax(model(window[:, :-1]).logits.double(), -1)[0]
    targets = window[0, 1:]
    nll_t = -logp.gather(-1, targets[:, None])[:, 0]
    new = end - 1 - prev_end  # the window's last `new` targets were not scored before
    total += float(nll_t[-new:].sum())
    count += new
    prev_end = end - 1
    if end == len(ids):
      break
  return total, count


def encode_pair(tok, context: str, choice: str) -> tuple[list[int], list[int]]:
  """lm-evaluation-harness's split of context and continuation tokens."""
  n_spaces = len(context) - len(context.rstrip())
  if n_spaces:
    context, choice = context[:-n_spaces], context[-n_spaces:] + choice
  whole = tok.encode(context + choice, add_special_tokens=False)
  n = len(tok.encode(context, add_special_tokens=False))
  return whole[:n], whole[n:]


def eval_expected(out_root: str) -> None:
  directory = os.path.join(out_root, "llama")
  model = transformers.LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32,
                                                        attn_implementation="eager").eval()
  tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory,
                                                                         "tokenizer.json"))
  rng = np.random.default_rng(0)
  text = " ".join(rng.choice(EVAL_WORDS, 120)) + ".\n"
  ids = tok.encode(text, add_special_tokens=False)
  eot = tok.convert_tokens_to_ids("</s>")
  context = model.config.max_position_embeddings
  items = []
  for _ in range(20):
    n_choices = int(rng.integers(2, 5))
    items.append({"context": " ".join(rng.choice(EVAL_WORDS, int(rng.integers(3, 9)))) + " ",
                  "choices": [" ".join(rng.choice(EVAL_WORDS, int(rng.integers(1, 4))))
                              for _ in range(n_choices)],
                  "answer": int(rng.integers(0, n_choices))})
  lls, acc, acc_norm = [], 0, 0
  with torch.no_grad():
    text_nll = {s: strided_nll(model, [eot] + ids, context, s) for s in EVAL_STRIDES}
    for item in items:
      ll = []
      for a in item["choices"]:
        c, x = encode_pair(tok, item["context"], a)
        logp = torch.log_softmax(model(torch.tensor([c + x])).logits.double(), -1)[0]
        ll.append(float(sum(logp[len(c) - 1 + j, t] for j, t in enumerate(x))))
      lls.append(ll)
      n_bytes = np.array([len(a.encode("utf-8")) for a in item["choices"]], np.float64)
      acc += int(np.argmax(ll)) == item["answer"]
      acc_norm += int(np.argmax(np.array(ll) / n_bytes)) == item["answer"]
  out = {"text": text, "text_ids": ids, "eot_id": eot, "context": context,
         "strided": {str(s): {"nll": v[0], "tokens": v[1], "perplexity": float(np.exp(v[0] / v[1])),
                              "bits_per_byte": v[0] / np.log(2) / len(text.encode("utf-8"))}
                     for s, v in text_nll.items()},
         "items": items, "loglikelihoods": lls, "acc": acc / len(items),
         "acc_norm": acc_norm / len(items),
         "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
  with open(os.path.join(directory, "eval.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  print(f"llama/eval.json: {len(ids)} text tokens, perplexity "
        f"{ {s: round(v['perplexity'], 4) for s, v in out['strided'].items()} }, acc {out['acc']}, "
        f"acc_norm {out['acc_norm']}")


# `--rope`: rope/expected.json, transformers' own ROPE_INIT_FUNCTIONS outputs (inverse
# frequencies and attention scaling) for configs of each RoPE type, at real checkpoints' sizes.
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


def rope_expected(out_root: str) -> None:
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  out = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
  for name, fields in ROPE_CASES.items():
    cfg = {**dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=64, num_hidden_layers=1, vocab_size=8,
                  max_position_embeddings=8192, head_dim=128), **fields}
    config = transformers.LlamaConfig(**cfg)
    kind = config.rope_parameters["rope_type"]
    # What the model runs (the default type's function is the rotary module's own method).
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    inv_freq, scaling = rotary.inv_freq, rotary.attention_scaling
    if kind != "default":
      init_freq, init_scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
      assert torch.equal(init_freq, inv_freq) and init_scaling == scaling, name
    out[name] = {"config": dict(cfg, model_type="llama"), "inv_freq": inv_freq.tolist(),
                 "attention_scaling": float(scaling)}
  os.makedirs(os.path.join(out_root, "rope"), exist_ok=True)
  with open(os.path.join(out_root, "rope", "expected.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, indent=0)
  print(f"rope/expected.json: {sorted(k for k in out if k != 'versions')}")


if __name__ == "__main__":
  args = [a for a in sys.argv[1:] if not a.startswith("--")]
  root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                           "tests", "data", "hf")
  if "--rope" in sys.argv[1:]:
    rope_expected(root)
  elif "--eval" in sys.argv[1:]:  # only llama/eval.json, from the committed llama model
    eval_expected(root)
  elif "--generation" in sys.argv[1:]:
    torch.use_deterministic_algorithms(True)
    for seed, name in enumerate(("llama", "mistral", "qwen2")):
      exp = expected_generation(os.path.join(root, name), name, 200 + seed)
      np.savez(os.path.join(root, name, "generate.npz"), **exp)
      print(f"{name}: generate.npz, greedy margin {exp['margin']:.4f}, eos {exp['eos']}, "
            f"eos rows {exp['eos_generated'].tolist()}")
  else:  # --only=a,b: only those models (the others' files stay as committed)
    only = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
    main(root, only[0] if only else None)
