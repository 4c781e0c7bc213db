"""Augmentation (data.augment): the per-record uniforms, each op against its formula, soft labels
through the classification loss, eval never augmented, and a resumed or re-sharded stream that
draws exactly the same augmentations."""

import jax
import jax.numpy as jnp
import functools

import ml_collections
import numpy as np
import optax
import pytest

from jaxdl import cli
from jaxdl.data import augment as aug
from jaxdl.data import default_data_config, digits_split, make_dataset
from jaxdl.train import make_task


def _digits(ops, n_train=96, batch_size=32):
  """The digits dataset with `ops` on the training stream (3 steps per epoch at the defaults)."""
  data = default_data_config("digits")
  data.update(augment=tuple(ops), n_train=n_train, batch_size=batch_size)
  return make_dataset(ml_collections.ConfigDict({"seed": 3, "data": data}))


def _raw_rows(ds, steps):
  """The un-augmented batches of the same stream (the augmentation never moves rows)."""
  plain = _digits((), ds.source.train.num, ds.batch_size)
  it = plain.train_iter()
  return [next(it) for _ in range(steps)]


def test_uniforms_are_splitmix64_of_the_record():
  # splitmix64's first output from state 0 (the reference value of Vigna's generator).
  assert int(aug.splitmix64(np.uint64(0))) == 0xE220A8397B1DCDAF
  u = aug.record_uniforms(7, 2, np.arange(20000))
  assert u.shape == (20000, aug.SLOTS) and u.min() >= 0.0 and u.max() < 1.0
  np.testing.assert_allclose(u.mean(0), 0.5, atol=0.01)   # std of the mean: 0.29 / sqrt(2e4)
  np.testing.assert_allclose(u.var(0), 1 / 12, atol=0.003)
  assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.03
  # A record's draws depend on (seed, epoch, row) only, not on the batch it is in.
  np.testing.assert_array_equal(aug.record_uniforms(7, 2, np.array([9, 4]))[1], u[4])
  assert not np.array_equal(aug.record_uniforms(7, 3, np.array([4]))[0], u[4])


def test_ops_follow_their_formulas():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 5, 4, 3)).astype(np.float32)
  u = rng.uniform(size=(6, 3))
  pad = 2
  out = aug.crop(x, u[:, :2], pad)
  for b in range(6):
    dy, dx = (int(v * (2 * pad + 1)) for v in u[b, :2])
    padded = np.zeros((5 + 2 * pad, 4 + 2 * pad, 3), np.float32)
    padded[pad:pad + 5, pad:pad + 4] = x[b]
    np.testing.assert_array_equal(out[b], padded[dy:dy + 5, dx:dx + 4])
  out = aug.flip(x, u[:, 0])
  for b in range(6):
    np.testing.assert_array_equal(out[b], x[b][:, ::-1] if u[b, 0] < 0.5 else x[b])
  s = 0.4
  out = aug.jitter(x, u, s)
  for b in range(6):
    f_b, f_c, f_a = 1 + s * (2 * u[b] - 1)
    y = f_b * x[b]
    grey = 0.299 * y[..., 0] + 0.587 * y[..., 1] + 0.114 * y[..., 2]
    y = grey.mean() + f_c * (y - grey.mean())
    grey = (0.299 * y[..., 0] + 0.587 * y[..., 1] + 0.114 * y[..., 2])[..., None]
    np.testing.assert_allclose(out[b], grey + f_a * (y - grey), rtol=1e-5, atol=1e-6)
  # Beta(1, 1) is uniform: the quantile of u is u.
  np.testing.assert_allclose(aug.beta_quantile(u[:, 0], 1.0), u[:, 0], rtol=1e-12)


def test_mixup_and_cutmix_pair_position_g_with_its_mirror():
  ds = _digits(["mixup=0.4"])
  raw, batch = _raw_rows(ds, 1)[0], next(ds.train_iter())
  x, q = batch["x"], batch["y"]
  np.testing.assert_allclose(q.sum(1), 1.0, rtol=1e-6)
  y, n = raw["y"], len(raw["y"])
  pairs = [(b, n - 1 - b) for b in range(n) if y[b] != y[n - 1 - b]]  # lam readable from q
  assert len(pairs) > n // 2
  for b, partner in pairs:
    lam = q[b, y[b]]
    np.testing.assert_allclose(x[b], lam * raw["x"][b] + (1 - lam) * raw["x"][partner],
                               rtol=1e-5, atol=1e-6)
  batch = next(_digits(["cutmix"]).train_iter())
  for b, partner in pairs:
    xb, xs, xp = batch["x"][b, ..., 0], raw["x"][b, ..., 0], raw["x"][partner, ..., 0]
    assert np.all((xb == xs) | (xb == xp))   # every pixel is one of the pair's
    taken = np.argwhere((xb == xp) & (xs != xp))
    box_pixels = round((1.0 - batch["y"][b, y[b]]) * 64)  # the partner's weight: the box area
    if len(taken):  # the pixels that came from the partner lie inside a box of that area
      rows, cols = taken.max(0) - taken.min(0) + 1
      assert rows * cols <= box_pixels


def test_soft_targets_through_the_classification_loss():
  """CE(z, lam e_a + (1 - lam) e_b) = lam CE(z, a) + (1 - lam) CE(z, b); onehot = integer labels."""
  task = make_task(ml_collections.ConfigDict(dict(task="classification", train={})))
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 5)), jnp.float32)
  identity = lambda variables, x, train, **kw: x  # noqa: E731 -- the logits are the input
  a, b, lam = np.array([0, 1, 2, 3]), np.array([4, 4, 0, 3]), 0.3
  q = lam * np.eye(5)[a] + (1 - lam) * np.eye(5)[b]
  loss_soft, (m, _) = task.loss_fn(identity, {}, {}, {"x": logits, "y": q}, {}, False)
  ce = lambda y: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()  # noqa: E731
  np.testing.assert_allclose(loss_soft, lam * ce(a) + (1 - lam) * ce(b), rtol=1e-6)
  loss_int, _ = task.loss_fn(identity, {}, {}, {"x": logits, "y": a}, {}, False)
  loss_onehot, (m1, _) = task.loss_fn(identity, {}, {}, {"x": logits, "y": np.eye(5)[a]}, {},
                                      False)
  np.testing.assert_allclose(loss_onehot, loss_int, rtol=1e-6)
  np.testing.assert_allclose(m["accuracy"], np.mean(np.argmax(logits, -1) == b), rtol=1e-6)


def test_eval_is_never_augmented_and_crops_are_shifts():
  ds = _digits(["crop=1", "mixup"])
  x_te = (digits_split()[2] / 16.0).astype(np.float32)[..., None]
  evals = next(iter(ds.eval_batches()))
  np.testing.assert_array_equal(evals["x"][:len(x_te)], x_te)
  assert evals["y"].ndim == 1
  ds = _digits(["crop=1"])
  raw, it = _raw_rows(ds, 4), ds.train_iter()
  shifted = 0
  for r in raw:  # 4 steps: into the second epoch, where the same records draw anew
    batch = next(it)
    np.testing.assert_array_equal(batch["y"], r["y"])
    for xa, xr in zip(batch["x"], r["x"]):
      pad = np.pad(xr, ((1, 1), (1, 1), (0, 0)))
      assert any(np.array_equal(xa, pad[i:i + 8, j:j + 8]) for i in range(3) for j in range(3))
      shifted += not np.array_equal(xa, xr)
  assert shifted > 0.8 * 4 * 32 * 0.7  # 8 of 9 offsets move the image (some rows match anyway)


def test_resumed_and_resharded_streams_draw_the_same_augmentations():
  ds = _digits(["crop=1", "mixup", "cutmix"])
  it = ds.train_iter()
  for _ in range(4):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]   # crosses into epoch 2
  resumed = ds.train_iter()
  resumed.set_state(state)
  halves = [ds.train_iter(p, 2) for p in (0, 1)]
  for h in halves:
    h.set_state(state)
  for want in expected:
    got, parts = next(resumed), [next(h) for h in halves]
    for k in ("x", "y"):
      np.testing.assert_array_equal(got[k], want[k])
      np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), want[k])


@pytest.mark.parametrize("setting,expected", [
    ("data.augment=('rotate',)", "data.augment: unknown op 'rotate'"),
    ("data.augment=('jitter',)", "data.augment: 'jitter' is colour jitter for RGB images"),
    ("data.augment=('crop=1.5',)", "data.augment: op 'crop': expected a whole number")])
def test_bad_augment_is_one_line_exit_2(setting, expected, tmp_path, capsys):
  workdir = tmp_path / "run"
  capsys.readouterr()
  assert cli.main(["train", "digits_cnn:smoke", "--set", setting, "--workdir", str(workdir),
                   "--no-progress"]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and expected in lines[0], lines
  assert not workdir.exists()


@pytest.mark.slow
def test_digits_subset_run_reports_its_train_test_gap(tmp_path):
  """digits_cnn:subset,aug trains on augmented digits and evaluates its own training digits
  un-augmented: the train loss it reports is the NLL of the saved model on those 160 digits."""
  from jaxdl.config import load_config
  from jaxdl.train import build, run
  from jaxdl.train.checkpoint import load_state
  config, module = load_config("digits_cnn:subset,aug,smoke", [
      "train.plot=False", "train.steps=5", "train.eval_every=0", "train.ckpt_every=0",
      "parallel.devices=1"])
  assert config.data.augment == ("crop=1",) and config.data.n_train == 160
  summary = run(config, tmp_path, progress=False)
  out = module.after_training(config, tmp_path, summary)
  _, saved = load_state(tmp_path)
  x_tr, y_tr = digits_split()[0][:160], digits_split()[1][:160]
  apply = jax.jit(functools.partial(build(config).model.apply, train=False))
  logits = apply({"params": saved["params"]}, (x_tr / 16.0).astype(np.float32)[..., None])
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, y_tr).mean()
  np.testing.assert_allclose(out["train_split"]["loss"], nll, rtol=1e-5)
  np.testing.assert_allclose(out["train_split"]["accuracy"],
                             np.mean(np.argmax(logits, -1) == y_tr), rtol=1e-6)
  np.testing.assert_allclose(out["gap"]["loss"],
                             summary["eval"]["loss"] - out["train_split"]["loss"], rtol=1e-6)
