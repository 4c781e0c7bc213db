"""Post-training evaluation of generative runs: distances to fresh data, and a classifier check.

`evaluate(config, workdir)` loads the run's latest checkpoint and
- on 'toy2d': draws `num` samples for each sampler at 1, 2, 4, 10, 50 steps and measures the
  energy distance (and, at the largest step count, the exact W2) to `num` fresh target samples,
  beside the floor, the same distance between two independent target draws; both averaged over
  `repeats` rounds of fresh draws (`evaluate_toy2d`); writes samples.png (rows samplers, columns
  steps);
- on 'digits': draws `per_class` samples of each class with the run's guidance, writes a PNG grid
  (one row per class) and reports the fraction a digits classifier labels as the conditioning
  class (its test accuracy is reported beside it). The classifier is given, never trained here:
  a workdir of a trained digits classifier run, a function predict(pixels16_Nx64) -> labels_N,
  or None for an RBF SVM fitted on the training split (seconds). Training a classifier run is the
  experiment's business (`jaxdl.course.digits_judge` does it in the digits experiments' hook).
Results go to workdir/generative_eval.json and are returned.

Shapes: N samples, K classes.
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.data import parse_data
from jaxdl.generative import metrics, tasks as gtasks
from jaxdl.generative.settings import parse_gen
from jaxdl.train.checkpoint import load_run
from jaxdl.train.tasks import kind_of

TOY_SEED_A, TOY_SEED_B = 10_000, 10_001  # fresh target draws, never the training seeds


def save_run(workdir, config, params, *, step: int, **gen) -> pathlib.Path:
  """Writes `params` as a run of its own that `load_run` and `jaxdl sample` read: config.json
  (`config` with `gen` overrides, e.g. sampler='euler', steps=1 for a few-step student) and one
  checkpoint at `step` holding {'params'} (no optimizer state: it samples, it does not resume).

  For models trained outside the engine (reflow and distillation students). Refuses a workdir
  that already holds a run, so an engine run is never overwritten.
  """
  from jaxdl.train.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  workdir = pathlib.Path(workdir)
  if (workdir / "config.json").exists():
    raise ValueError(f"{workdir}: already holds a run (config.json); choose another workdir")
  config = config.copy_and_resolve_references()
  if gen:
    config.gen.update(gen)
  config_json = json.loads(config.to_json_best_effort())
  ckpt = Checkpointer(workdir / "checkpoints", keep=1, async_save=False)
  ckpt.save(step, {"params": params}, data_state={}, config=config_json,
            manifest={"written_by": "jaxdl.generative.evaluation.save_run",
                      "experiment": config.name})
  ckpt.close()
  (workdir / "config.json").write_text(json.dumps(config_json, indent=2))
  return workdir


def _default_samplers(config):
  return ("euler", "heun") if kind_of(config.task).path == "flow" else ("ddim", "ddpm")


def evaluate(config, workdir, *, samplers=None, steps_list=(1, 2, 4, 10, 50), num=2000,
             repeats=8, per_class=100, classifier=None, seed=0, figure=True) -> dict:
  """Evaluates a trained 'flow_matching' / 'ddpm' run; see the module docstring."""
  config, model, variables, step = load_run(workdir, config)
  if config.data.name == "toy2d":
    out = evaluate_toy2d(config, model, variables, samplers or _default_samplers(config),
                         steps_list, num, seed, pathlib.Path(workdir) if figure else None,
                         repeats=repeats)
  elif config.data.name == "digits":
    out = evaluate_digits(config, model, variables, per_class, classifier, seed,
                          pathlib.Path(workdir) if figure else None)
  else:
    raise ValueError(f"data.name: no generative evaluation for {config.data.name!r}; expected "
                     "'toy2d' or 'digits'")
  out["step"] = int(step)
  (pathlib.Path(workdir) / "generative_eval.json").write_text(json.dumps(out, indent=2))
  return out


def evaluate_toy2d(config, model, variables, sampler_names, steps_list, num, seed, fig_dir,
                   repeats: int = 8):
  """Energy distance (and exact W2 at the largest step count) to fresh target draws, averaged.

  One draw of n = 2,000 points is too noisy to judge a 3x margin: the two-draw distance itself
  spans 0.9e-3 .. 4.2e-3 over eight pairs of moons draws. So each of `repeats` rounds r takes a
  fresh target pair (A_r, B_r) and a fresh sampler key: floor_r = D(B_r, A_r) and
  D_r = D(samples_r, A_r). Reported: the means over rounds, the standard error of the mean of
  D_r ('energy_se'), and ratio = mean D / mean floor.
  """
  from jaxdl.data import sample_toy2d  # pylint: disable=g-import-not-at-top
  if repeats < 1:
    raise ValueError(f"repeats={repeats}: expected >= 1")
  dist = config.data.distribution
  w2_steps = max(steps_list)  # W2 is O(n^3): only where the acceptance is judged
  targets = [(sample_toy2d(dist, num, TOY_SEED_A + 2 * r),
              sample_toy2d(dist, num, TOY_SEED_B + 2 * r))
             for r in range(repeats)]
  floor_r = {"energy": [metrics.energy_distance(b, a) for a, b in targets],
             "w2": [metrics.wasserstein2(b, a) for a, b in targets]}
  floor = {k: float(np.mean(v)) for k, v in floor_r.items()}
  floor["energy_rounds"] = [float(v) for v in floor_r["energy"]]
  results, grids = {}, {}
  for name in sampler_names:
    for steps in steps_list:
      sample = gtasks.make_run_sampler(config, model, sampler=name, steps=steps, sample_shape=(2,))
      draws = [np.asarray(sample(variables, jax.random.PRNGKey(seed + r), num))
               for r in range(repeats)]
      d_r = [metrics.energy_distance(x, a) for x, (a, _) in zip(draws, targets)]
      res = {"energy": float(np.mean(d_r)),
             "energy_se": float(np.std(d_r, ddof=1) / np.sqrt(repeats)) if repeats > 1 else None}
      res["energy_ratio"] = res["energy"] / floor["energy"]
      if steps == w2_steps:
        res["w2"] = float(np.mean([metrics.wasserstein2(x, a)
                                   for x, (a, _) in zip(draws, targets)]))
        res["w2_ratio"] = res["w2"] / floor["w2"]
      results[f"{name}@{steps}"] = res
      grids[(name, steps)] = draws[0]
  if fig_dir is not None:
    _toy_figure(grids, sampler_names, steps_list, targets[0][0], results, fig_dir / "samples.png",
                dist)
  return {"distribution": dist, "num": num, "repeats": repeats, "floor": floor,
          "results": results}


def _toy_figure(grids, sampler_names, steps_list, target, results, path, title):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows, cols = len(sampler_names), len(steps_list) + 1
  fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.2 * rows), squeeze=False)
  for r, name in enumerate(sampler_names):
    for c, steps in enumerate(steps_list):
      ax = axes[r, c]
      x = grids[(name, steps)]
      ax.scatter(x[:, 0], x[:, 1], s=0.5, alpha=0.5)
      ax.set_title(f"{name} {steps} st.\nED/floor {results[f'{name}@{steps}']['energy_ratio']:.1f}",
                   fontsize=7)
    axes[r, -1].scatter(target[:, 0], target[:, 1], s=0.5, alpha=0.5, color="k")
    axes[r, -1].set_title("target", fontsize=7)
  for ax in axes.flat:
    ax.set_xlim(-3, 3), ax.set_ylim(-3, 3), ax.set_xticks([]), ax.set_yticks([])
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ----------------------------------------------------------------------------- digits


def _to_pixels16(x_N, scale: str):
  """Model space ('unit' [0, 1] or 'symmetric' [-1, 1]) -> raw digits pixels 0..16, clipped."""
  x = np.asarray(x_N, np.float32)
  if scale == "symmetric":
    x = (x + 1.0) / 2.0
  return np.clip(16.0 * x, 0.0, 16.0).reshape(len(x), 64)


def digits_classifier(classifier=None):
  """Returns (predict(pixels16_Nx64) -> labels_N, test_accuracy, name) for `classifier`:

  a workdir (str or path) of a trained digits classification run, loaded from its latest
  checkpoint; a function predict(pixels16_Nx64) -> labels_N, used as given; or None, an RBF SVM
  fitted on the digits training split. The test accuracy is measured on the fixed test split.
  """
  from jaxdl.data.sources import digits_split  # pylint: disable=g-import-not-at-top
  x_tr, y_tr, x_te, y_te = digits_split()
  if callable(classifier):
    predict, name = classifier, getattr(classifier, "__name__", "given classifier")
  elif classifier is not None:
    predict, name = _run_classifier(classifier), f"classifier run {classifier}"
  else:
    from sklearn.svm import SVC  # pylint: disable=g-import-not-at-top
    svm = SVC(gamma="scale", C=10.0).fit(x_tr.reshape(len(x_tr), 64), y_tr)
    predict = svm.predict  # (N, 64) pixels -> (N,) labels
    name = "RBF SVM on the digits training split"
  test_acc = float(np.mean(predict(x_te.reshape(len(x_te), 64).astype(np.float32)) == y_te))
  return predict, test_acc, name


def _judge_input(p16_Nx64, scale: str):
  """Digits pixels in 0..16 as a judge's input: (N, 8, 8, 1) in its data's `scale`."""
  x = (np.asarray(p16_Nx64) / 16.0).reshape((-1, 8, 8, 1)).astype(np.float32)
  return 2 * x - 1 if scale == "symmetric" else x


def _run_classifier(workdir):
  """predict(pixels16_Nx64) -> labels_N of the trained classification run in `workdir`."""
  config, model, variables, _ = load_run(workdir)
  scale = parse_data(config.data).scale

  def predict(p16_Nx64):
    x = _judge_input(p16_Nx64, scale)
    return np.asarray(jnp.argmax(model.apply(variables, x, train=False), -1))

  return predict


def classifier_outputs(workdir):
  """f(pixels16_Nx64) -> (probs_NxK, features_NxH) of the trained classification run in `workdir`:
  its softmax and its penultimate activation (the ReLU of its 'dense' layer, the feature space of
  the digits Frechet distance; the CNN and MLP heads both name that layer 'dense')."""
  config, model, variables, _ = load_run(workdir)
  scale = parse_data(config.data).scale

  @jax.jit
  def outputs(x):
    logits, state = model.apply(variables, x, train=False, capture_intermediates=True,
                                mutable=["intermediates"])
    hidden = state["intermediates"]["dense"]["__call__"][0]
    return jax.nn.softmax(logits, -1), jax.nn.relu(hidden)

  def f(p16_Nx64):
    probs, feats = outputs(_judge_input(p16_Nx64, scale))
    return np.asarray(probs), np.asarray(feats)

  return f


def digits_quality(outputs, pix_Nx64, labels_N=None, *, threshold: float = 0.9, seed: int = 0):
  """Sample quality of digits pixels (0..16) judged by `classifier_outputs`' f:

  confident: the fraction whose top class probability is >= `threshold` (and, with `labels_N`,
  equals the label); frechet: the Frechet distance between the penultimate features of the
  samples and of m random real digits (of the 1,797, train + test; m = the sample count, at most
  half of them); frechet_floor: the same between those m real digits and m others, what a perfect
  model would still get.
  """
  from jaxdl.data.sources import digits_split  # pylint: disable=g-import-not-at-top
  x_tr, _, x_te, _ = digits_split()
  real_Rx64 = np.concatenate([x_tr, x_te]).reshape(-1, 64).astype(np.float32)
  probs, feats = outputs(pix_Nx64)
  ok = probs.max(-1) >= threshold
  if labels_N is not None:
    ok &= probs.argmax(-1) == np.asarray(labels_N)
  _, real_feats = outputs(real_Rx64)
  m = min(len(pix_Nx64), len(real_Rx64) // 2)
  perm = np.random.default_rng(seed).permutation(len(real_Rx64))
  return {"confident": float(np.mean(ok)), "threshold": threshold,
          "frechet": metrics.frechet_distance(feats, real_feats[perm[:m]]),
          "frechet_floor": metrics.frechet_distance(real_feats[perm[m:2 * m]],
                                                    real_feats[perm[:m]]),
          "num": int(len(pix_Nx64)), "num_real": m}


def evaluate_digits(config, model, variables, per_class, classifier, seed, fig_dir):
  """Class accuracy of `per_class` guided samples per class, judged by `classifier` (see
  `digits_classifier`)."""
  k = config.gen.num_classes
  if not k:
    raise ValueError("gen.num_classes: the digits check needs a class-conditional run")
  predict, test_acc, clf_name = digits_classifier(classifier)
  sample = gtasks.make_run_sampler(config, model)
  y_N = np.repeat(np.arange(k), per_class)
  x = sample(variables, jax.random.PRNGKey(seed), len(y_N), y=y_N)
  pix_Nx64 = _to_pixels16(x, config.data.scale)
  acc = float(np.mean(predict(pix_Nx64) == y_N))
  if fig_dir is not None:
    digit_grid(pix_Nx64.reshape(k, per_class, 8, 8)[:, :10], fig_dir / "digits_grid.png")
  return {"guidance": config.gen.guidance, "sampler": config.gen.sampler, "steps": config.gen.steps,
          "class_accuracy": acc, "classifier": clf_name, "classifier_test_accuracy": test_acc,
          "num": int(len(y_N))}


CELL_PX = 48  # each image of a grid is drawn this many pixels wide (an 8x8 digit at 6x)


def image_grid(img_RxCxHxW, path, *, row_labels=None, row_title: str = "class",
               title: str | None = None) -> None:
  """Writes R rows of C images (values in [0, 1], dark ink on white; a last axis of 3 is RGB)
  to `path` (.png, .jpg or .pdf by its suffix): each image CELL_PX pixels wide, nearest-neighbour,
  `row_labels` (e.g. the class of each row) written left of the rows under `row_title`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  img = np.clip(np.asarray(img_RxCxHxW, np.float32), 0.0, 1.0)
  rows, cols, h, w = img.shape[:4]
  rgb = img.ndim == 5 and img.shape[-1] == 3
  # Grey 1-pixel lines between the images, so that white backgrounds do not run together.
  canvas = np.full((rows * (h + 1) + 1, cols * (w + 1) + 1) + ((3,) if rgb else ()), 0.6)
  for r in range(rows):
    for c in range(cols):
      cell = img[r, c] if rgb else 1.0 - img[r, c].reshape(h, w)  # ink dark on white
      canvas[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = cell
  dpi, scale = 100, CELL_PX / max(h, w)
  fig_w, fig_h = canvas.shape[1] * scale / dpi, canvas.shape[0] * scale / dpi
  left_in = 0.8 if row_labels is not None else 0.1
  if title:  # wrapped to the figure's width (about 7 pixels a character at 9 points)
    title = textwrap.fill(title, max(20, int((fig_w + left_in) * dpi / 7)))
  margin_in = (left_in, 0.1 + 0.17 * (title.count("\n") + 1) if title else 0.1)
  fig = plt.figure(figsize=(fig_w + margin_in[0] + 0.1, fig_h + margin_in[1] + 0.1), dpi=dpi)
  ax = fig.add_axes((margin_in[0] / fig.get_figwidth(), 0.1 / fig.get_figheight(),
                     fig_w / fig.get_figwidth(), fig_h / fig.get_figheight()))
  ax.imshow(canvas, cmap=None if rgb else "gray", vmin=0, vmax=1, interpolation="nearest")
  ax.set_xticks([])
  if row_labels is None:
    ax.set_yticks([])
  else:
    ax.set_yticks([1 + r * (h + 1) + (h - 1) / 2 for r in range(rows)])
    ax.set_yticklabels([str(label) for label in row_labels], fontsize=11)
    ax.set_ylabel(row_title, fontsize=11)
  if title:  # centred on the figure, not the axes, so that the labels' margin does not clip it
    fig.text(0.5, 1 - 0.05 / fig.get_figheight(), title, ha="center", va="top", fontsize=9)
  fig.savefig(path, dpi=dpi)
  plt.close(fig)


def digit_grid(img_KxMx8x8, path):
  """Digits pixels 0..16, one row per class k = 0..K-1, as a labelled `image_grid`."""
  image_grid(np.asarray(img_KxMx8x8) / 16.0, path, row_labels=range(len(img_KxMx8x8)))


def after_training(config, workdir, summary=None, **eval_kwargs) -> dict:
  """The generative experiments' post-training step: `evaluate` on the final checkpoint, returned
  under 'generative'. `eval_kwargs` go to `evaluate` (e.g. `classifier=` for the digits check);
  the sample count defaults to `gen.eval_num` (split evenly over the classes on digits); a smoke
  run (`config.smoke`) evaluates the 2-D toys at `gen.steps` only, over 2 rounds."""
  del summary
  gen = parse_gen(config)
  num = gen.eval_num
  if config.smoke:  # a smoke run checks the procedure, not the numbers: one step count, 2 rounds
    eval_kwargs.setdefault("steps_list", (gen.steps,))
    eval_kwargs.setdefault("repeats", 2)
  if config.data.name == "digits":
    eval_kwargs.setdefault("per_class", max(num // config.gen.num_classes, 1))
  else:
    eval_kwargs.setdefault("num", num)
  return {"generative": evaluate(config, workdir, **eval_kwargs)}
