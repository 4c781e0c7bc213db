"""`jaxdl sample WORKDIR`: draw samples from a trained generative run's latest checkpoint.

  jaxdl sample runs/fm_digits_cfg                       # every class, 8 of each, labelled rows
  jaxdl sample runs/fm_digits_cfg --class 3 --num 64 --sampler dpmpp_2m --steps 10 --out 3.png

Unset options take the run's `config.gen.*` values (its guidance too). A class-conditional run
without `--class` draws `--num` (default 8) samples of every class, one labelled row per class;
otherwise `--num` (default 64) samples. The output's suffix picks its kind: .png, .jpg or .pdf a
figure (an image grid, each image 48 pixels wide, or a scatter plot of 2-D data), .npy the raw
samples, .npz the samples and their classes (x, y). Every option and the output path are checked
before the checkpoint is read; the file is written whole or not at all. The sampling itself is
`jaxdl.generative.trained.sample_run`. Quality against network calls is `jaxdl nfe`; text
continuation `jaxdl generate`.
"""

from __future__ import annotations

HELP = "sample from a trained flow_matching / ddpm / edm / vae / gan run"


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--sampler", default=None,
                      help="ddpm | ddim | euler | heun | edm_heun | dpmpp_2m | dpmpp_3m "
                           "(default: the run's)")
  parser.add_argument("--steps", type=int, default=None, help="sampler steps (default: the run's)")
  parser.add_argument("--guidance", type=float, default=None,
                      help="classifier-free guidance w >= 0 (default: the run's)")
  parser.add_argument("--eta", type=float, default=None,
                      help="DDIM noise scale (0 = deterministic)")
  parser.add_argument("--class", dest="cls", type=int, default=None,
                      help="the one class to draw (default: every class of a class-conditional "
                           "run, a row each)")
  parser.add_argument("--num", type=int, default=None,
                      help="samples (default 64), or of each class when drawing every class "
                           "(default 8)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="samples.png",
                      help="output .png, .jpg, .pdf, .npy or .npz (default samples.png)")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="sample with the last parameters even if the run kept an average "
                           "(optim.ema_decay)")


def main(args) -> None:
  from jaxdl.generative import trained
  from jaxdl.schema import ConfigError
  trained.check_out(args.out)
  try:
    config, x, y, title = trained.sample_run(
        args.workdir, sampler=args.sampler, steps=args.steps, guidance=args.guidance,
        eta=args.eta, cls=args.cls, num=args.num, seed=args.seed, ema=args.ema)
  except ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:  # a checkpoint that does not fit the run
    raise ConfigError(str(e).splitlines()[0]) from None
  trained.save_samples(config, x, args.out, y=y, title=title)
  per = "" if y is None or args.cls is not None else (
      f" ({len(x) // len(set(y.tolist()))} of each of {len(set(y.tolist()))} classes)")
  print(f"wrote {len(x)} samples{per} to {args.out}")
