"""`jaxdl sample WORKDIR`: draw samples from a trained generative run's latest checkpoint.

  jaxdl sample runs/fm_digits_cfg --sampler heun --steps 50 --guidance 2.0 --class 3 --num 64 \
      --out grid.png

Unset options take the run's `config.gen.*` values. The output is a PNG (an image grid for image
data, a scatter plot for 2-D data) or, for a name ending in .npy, the raw samples. The sampling
itself is `jaxdl.generative.trained.sample_run`.

  jaxdl sample runs/fm_digits_cfg --sweep-steps 4,8,16,32,64 [--samplers ddim,euler] [--out DIR]

measures instead sample quality against network calls for every applicable sampler of a
class-conditional digits run (`jaxdl.course.sampler_table`, `jaxdl.generative.nfe_sweep`):
prints the table and writes nfe_sweep.json and nfe_sweep.png into DIR (default: the workdir).

  jaxdl sample path/to/hf_model --prompt "Once upon a time" --max-new-tokens 40 [--greedy]

continues text with a Hugging Face Llama / Mistral / Qwen2 / GPT-2 directory (`jaxdl.models.hf`)
and the tokenizer.json beside its weights: `--num` continuations (default 1) drawn with
`--temperature`, `--top-k`, `--top-p` (`jaxdl.models.decoding`), printed one per line.
"""

from __future__ import annotations

import json
import os
import sys

HELP = ("sample from a trained flow_matching / ddpm / vae / gan run, or continue a --prompt with "
        "a Hugging Face model directory")


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--sampler", default=None,
                      help="ddpm | ddim | euler | heun | edm_heun | dpmpp_2m | dpmpp_3m "
                           "(default: the run's)")
  parser.add_argument("--steps", type=int, default=None, help="sampler steps (default: the run's)")
  parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance w")
  parser.add_argument("--eta", type=float, default=None,
                      help="DDIM noise scale (0 = deterministic)")
  parser.add_argument("--class", dest="cls", type=int, default=None, help="class to condition on")
  parser.add_argument("--num", type=int, default=None,
                      help="number of samples (default 64; 1 with --prompt)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None,
                      help="output .png or .npy (default samples.png); with --sweep-steps a "
                           "folder (default: the workdir)")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="sample with the last parameters even if the run kept an average "
                           "(optim.ema_decay)")
  text = parser.add_argument_group("text from a Hugging Face model directory (WORKDIR)")
  text.add_argument("--prompt", default=None, help="the text to continue")
  text.add_argument("--max-new-tokens", type=int, default=32, help="tokens to add (default 32)")
  text.add_argument("--temperature", type=float, default=1.0, help="softmax temperature")
  text.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: all)")
  text.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1.0: all)")
  text.add_argument("--greedy", action="store_true", help="take the likeliest token each step")
  sweep = parser.add_argument_group("quality against network calls (class-conditional digits)")
  sweep.add_argument("--sweep-steps", default=None, metavar="N,N,...",
                     help="step counts to sweep, e.g. 4,8,16,32,64: judge every sampler at each")
  sweep.add_argument("--samplers", default=None, metavar="NAME,NAME,...",
                     help="samplers of the sweep (default ddpm,ddim,euler,heun,dpmpp_2m,edm_heun)")
  sweep.add_argument("--per-class", type=int, default=100, help="samples per class (sweep)")
  sweep.add_argument("--judge", default=None,
                     help="a digits classification run's workdir (default <workdir>/classifier, "
                          "trained there if missing)")


SWEEP_CONFLICTS = (("sampler", "--sampler (use --samplers)"), ("steps", "--steps"),
                   ("cls", "--class"), ("eta", "--eta"), ("guidance", "--guidance"))


def parse_sweep(args) -> tuple[list[int], list[str] | None]:
  """(step counts, sampler names or None) of --sweep-steps / --samplers, refusing an option of a
  single sampling run given beside them."""
  given = [flag for key, flag in SWEEP_CONFLICTS if getattr(args, key) is not None]
  if given:
    raise ValueError(f"{given[0]}: not an option of --sweep-steps, which runs every sampler at "
                     "each step count with the run's guidance")
  try:
    steps = [int(n) for n in args.sweep_steps.split(",") if n.strip()]
  except ValueError:
    raise ValueError(f"--sweep-steps {args.sweep_steps}: expected integers like 4,8,16") from None
  names = [n.strip() for n in args.samplers.split(",") if n.strip()] if args.samplers else None
  return steps, names


def check_request(workdir: str, num: int, out: str) -> None:
  """Refuses, with one line naming the option or path, what would fail only after loading the
  checkpoint and sampling: `--num` < 1, an `--out` folder that is missing or read-only, and a
  workdir that holds no run or a run that is not a flow_matching / ddpm / vae / gan one."""
  from jaxdl.generative import trained  # noqa: F401  registers the generative tasks
  from jaxdl.train.tasks import kind_of, task_names
  if num < 1:
    raise ValueError(f"--num: must be >= 1, got {num}")
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise ValueError(f"--out {out}: folder {folder} does not exist")
  if not os.access(folder, os.W_OK):
    raise ValueError(f"--out {out}: folder {folder} is not writable")
  config_json = os.path.join(workdir, "config.json")
  if not os.path.isfile(config_json):
    raise ValueError(f"{workdir}: no trained run here (no config.json)")
  try:
    task = json.loads(open(config_json, encoding="utf-8").read()).get("task")
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{config_json}: unreadable ({type(e).__name__}: {e})") from None
  if not kind_of(task).is_generative:
    raise ValueError(f"{workdir}: a {task!r} run has nothing to sample; `jaxdl sample` needs "
                     f"a {' or '.join(task_names(lambda k: k.is_generative))} run")


def main(args) -> int:
  if args.prompt is not None:
    return main_text(args)
  args.num = 64 if args.num is None else args.num
  if args.sweep_steps is not None:
    return main_sweep(args)
  if args.samplers is not None:
    print("jaxdl: error: --samplers: only with --sweep-steps (one run takes --sampler)",
          file=sys.stderr)
    return 2
  from jaxdl.generative import trained
  args.out = args.out or "samples.png"
  try:
    check_request(args.workdir, args.num, args.out)
    config, x = trained.sample_run(args.workdir, sampler=args.sampler, steps=args.steps,
                                   guidance=args.guidance, eta=args.eta, cls=args.cls,
                                   num=args.num, seed=args.seed, ema=args.ema)
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  trained.save_samples(config, x, args.out)
  print(f"wrote {args.num} samples to {args.out}")
  return 0


def main_sweep(args) -> int:
  from jaxdl.course import sampler_table
  from jaxdl.generative import nfe_sweep
  out_dir = args.out or args.workdir
  try:
    steps, names = parse_sweep(args)
    if not os.path.isdir(out_dir):
      raise ValueError(f"--out {out_dir}: not a folder (with --sweep-steps --out names a folder)")
    if not os.access(out_dir, os.W_OK):
      raise ValueError(f"--out {out_dir}: folder is not writable")
    table = sampler_table.sampler_table(
        args.workdir, steps, samplers=names or nfe_sweep.DEFAULT_SAMPLERS, judge=args.judge,
        per_class=args.per_class, seed=args.seed, ema=args.ema, out_dir=out_dir)
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  print(nfe_sweep.markdown(table))
  print(f"wrote {os.path.join(out_dir, 'nfe_sweep.json')} and nfe_sweep.png")
  return 0


def main_text(args) -> int:
  """Continues --prompt with the Hugging Face model in the workdir (module docstring)."""
  import jax
  import numpy as np
  from jaxdl.data.tokenize import load_hf_tokenizer
  from jaxdl.models import decoding, hf
  num = 1 if args.num is None else args.num
  try:
    given = [flag for key, flag in SWEEP_CONFLICTS if getattr(args, key) is not None]
    if given or args.sweep_steps is not None or args.out is not None:
      flag = given[0] if given else ("--sweep-steps" if args.sweep_steps else "--out")
      raise ValueError(f"{flag}: not an option of --prompt, which prints text continuations")
    for flag, value, ok, expected in (
        ("--num", num, num >= 1, ">= 1"),
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1, ">= 1"),
        ("--temperature", args.temperature, args.temperature > 0, "> 0"),
        ("--top-k", args.top_k, args.top_k >= 0, ">= 0"),
        ("--top-p", args.top_p, 0 < args.top_p <= 1, "in (0, 1]")):
      if not ok:
        raise ValueError(f"{flag}: must be {expected}, got {value}")
    model, params = hf.load_hf(args.workdir)
    tok = load_hf_tokenizer(args.workdir, model.vocab_size, key=args.workdir)
    ids = tok.encode(args.prompt)
    if not len(ids):
      raise ValueError("--prompt: encodes to no tokens")
    if len(ids) + args.max_new_tokens > model.block_size:
      raise ValueError(f"--max-new-tokens: {len(ids)} prompt tokens + {args.max_new_tokens} "
                       f"exceed the model's context of {model.block_size}")
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  prompt_BxP = np.tile(ids[None], (num, 1))
  out_BxN = decoding.generate(model, params, prompt_BxP, jax.random.key(args.seed),
                              args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, greedy=args.greedy)
  for row in np.asarray(out_BxN):
    print(tok.decode(row))
  return 0
