"""jaxdl.data: datasets, the seeded global-batch stream, per-process shards, exact resume."""

import json

import ml_collections
import numpy as np
import pytest

import jaxdl.data as data


def make_config(name, seed=0, **overrides):
  d = data.default_data_config(name)
  for k, v in overrides.items():
    d[k] = v
  return ml_collections.ConfigDict({"seed": seed, "data": d})


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def row_ids(batch, x_all):
  """Index of each batch row in x_all (rows are unique points)."""
  lookup = {tuple(r): i for i, r in enumerate(x_all)}
  return np.array([lookup[tuple(r)] for r in batch["x"]])


# --- datasets --------------------------------------------------------------------------------


def test_moons_train_is_the_sklearn_draw_and_eval_is_independent():
  from sklearn.datasets import make_moons  # imported here: 1.6 s at collection
  ds = data.make_dataset(make_config("moons", shuffle=False))
  x_ref, y_ref = make_moons(n_samples=1000, noise=0.25, random_state=42)
  batch = next(ds.train_iter())  # batch_size 1000: the course's full batch
  np.testing.assert_array_equal(batch["x"], x_ref.astype(np.float32))
  np.testing.assert_array_equal(batch["y"], y_ref.astype(np.float32))
  assert batch["x"].dtype == np.float32 and batch["y"].shape == (1000,)
  (ev,) = list(ds.eval_batches())
  x_ev, _ = make_moons(n_samples=1000, noise=0.25, random_state=43)
  np.testing.assert_array_equal(ev["x"], x_ev.astype(np.float32))
  assert ds.info == dict(ds.info, kind="binary", num_classes=2, input_shape=(2,),
                         num_train=1000, num_eval=1000)
  # Shuffled full batches hold the same 1000 points in another order.
  shuffled = next(data.make_dataset(make_config("moons")).train_iter())
  ids = row_ids(shuffled, x_ref.astype(np.float32))
  assert sorted(ids) == list(range(1000)) and (ids != np.arange(1000)).any()


def test_digits_split_is_stratified_fixed_and_scaled():
  from sklearn.datasets import load_digits  # imported here: 1.6 s at collection
  ds = data.make_dataset(make_config("digits", shuffle=False, batch_size=1437))
  assert (ds.info["num_train"], ds.info["num_eval"]) == (1437, 360)
  assert ds.info["input_shape"] == (8, 8, 1) and ds.info["num_classes"] == 10
  tr = next(ds.train_iter())
  (te,) = list(ds.eval_batches())
  assert tr["x"].dtype == np.float32 and tr["y"].dtype == np.int32
  assert tr["x"].min() == 0.0 and tr["x"].max() == 1.0
  # Stratified: each class has round(20%) of its examples in the test split, +-1.
  counts = np.bincount(load_digits().target, minlength=10)
  np.testing.assert_allclose(np.bincount(te["y"], minlength=10), 0.2 * counts, atol=1.0)
  # The split partitions the 1797 images (pixels * 16 are the original integers).
  both = np.concatenate([tr["x"], te["x"]])[..., 0] * 16
  ref = load_digits().images
  def key(a):
    return sorted(map(bytes, a.astype(np.uint8).reshape(len(a), -1)))
  assert key(both) == key(ref)
  # Fixed: a fresh build (another seed) has the same test set.
  (te2,) = list(data.make_dataset(make_config("digits", seed=5)).eval_batches())
  np.testing.assert_array_equal(te["x"], te2["x"])
  sym = next(data.make_dataset(make_config("digits", shuffle=False, batch_size=1437,
                                           scale="symmetric")).train_iter())
  np.testing.assert_allclose(sym["x"], 2.0 * tr["x"] - 1.0)


@pytest.mark.parametrize("name", data.sources.TOY2D)
def test_toy2d_standardized_and_seeded(name):
  x = data.sample_toy2d(name, 20_000, seed=1)
  assert x.shape == (20_000, 2) and x.dtype == np.float32
  np.testing.assert_allclose(x.mean(0), 0.0, atol=0.05)
  np.testing.assert_allclose(x.std(0), 1.0, atol=0.05)
  np.testing.assert_array_equal(x, data.sample_toy2d(name, 20_000, seed=1))
  assert not np.array_equal(x, data.sample_toy2d(name, 20_000, seed=2))


@pytest.mark.parametrize("name", data.sources.TOY2D)
def test_toy2d_draws_are_independent_samples(name):
  """Two fresh draws are as far apart as two random halves of one big draw (independent points by
  construction). make_moons' evenly spaced angles would fail this: its two-draw energy distance
  is about 6x too small, a floor no sampler of the distribution could reach."""
  from jaxdl.generative import metrics
  big = data.sample_toy2d(name, 40_000, seed=7)
  idx = np.random.default_rng(0).permutation(len(big))
  fresh = np.mean([metrics.energy_distance(data.sample_toy2d(name, 1000, seed=100 + 2 * r),
                                           data.sample_toy2d(name, 1000, seed=101 + 2 * r))
                   for r in range(8)])
  halves = np.mean([metrics.energy_distance(big[idx[2000 * r:2000 * r + 1000]],
                                            big[idx[2000 * r + 1000:2000 * (r + 1)]])
                    for r in range(8)])
  assert 0.6 < fresh / halves < 1.6, (fresh, halves)


def test_toy2d_dataset():
  ds = data.make_dataset(make_config("toy2d", distribution="8gaussians", n=512, batch_size=64))
  assert ds.info["kind"] == "generative" and ds.info["input_shape"] == (2,)
  b = next(ds.train_iter())
  assert set(b) == {"x"} and b["x"].shape == (64, 2)
  # 8 gaussians: radius 2 / 1.428 around the origin, std 0.2 / 1.428 each.
  r = np.linalg.norm(data.sample_toy2d("8gaussians", 4000, 0), axis=1)
  assert abs(np.median(r) - 2.0 / 1.428) < 0.05


def test_text_windows_are_next_byte_pairs():
  cfg = make_config("text", max_bytes=200_000, context_length=32, batch_size=8,
                    max_eval_windows=20, eval_batch_size=8)
  ds = data.make_dataset(cfg)
  assert ds.info["kind"] == "lm" and ds.info["vocab_size"] == 256
  assert ds.info["input_shape"] == (32,) and ds.info["num_eval"] == 20
  b = next(ds.train_iter())
  assert b["x"].shape == b["y"].shape == (8, 32) and b["x"].dtype == np.int32
  np.testing.assert_array_equal(b["y"][:, :-1], b["x"][:, 1:])
  assert 0 <= b["x"].min() and b["x"].max() < 256
  assert isinstance(data.decode(b["x"][0]), str)
  assert data.decode(np.frombuffer("héllo".encode(), np.uint8)) == "héllo"
  evs = list(ds.eval_batches())
  assert [e["mask"].sum() for e in evs] == [8, 8, 4]
  for e in evs:
    np.testing.assert_array_equal(e["y"][:, :-1], e["x"][:, 1:])
  # Train and val come from different files: no val window appears among the train windows.
  train_rows = {bytes(r.astype(np.uint8)) for b in take(ds.train_iter(), 50) for r in b["x"]}
  assert not train_rows & {bytes(r.astype(np.uint8)) for e in evs for r in e["x"]}


def test_textfile_and_npz(tmp_path):
  p = tmp_path / "t.txt"
  p.write_bytes(bytes(range(256)) * 8)
  ds = data.make_dataset(make_config("textfile", path=str(p), context_length=16, batch_size=4,
                                     val_frac=0.25))
  b = next(ds.train_iter())
  # Bytes count up mod 256, so the next byte is x + 1 mod 256.
  np.testing.assert_array_equal(b["y"], (b["x"] + 1) % 256)
  assert ds.info["num_train"] == (1536 - 1) // 16

  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(50, 3)), rng.integers(0, 4, 50)
  np.savez(tmp_path / "a.npz", x=x, y=y)
  ds = data.make_dataset(make_config("npz", path=str(tmp_path / "a.npz"), batch_size=10,
                                     eval_frac=0.2, shuffle=False))
  assert (ds.info["num_train"], ds.info["num_eval"], ds.info["num_classes"]) == (40, 10, 4)
  tr = np.concatenate([b["x"] for b in take(ds.train_iter(), 4)])
  (ev,) = list(ds.eval_batches())
  assert sorted(map(tuple, np.concatenate([tr, ev["x"]]))) == sorted(map(tuple,
                                                                        x.astype(np.float32)))
  np.savez(tmp_path / "b.npz", x=x, y=y, x_eval=x[:7], y_eval=y[:7])
  ds = data.make_dataset(make_config("npz", path=str(tmp_path / "b.npz"), kind="binary",
                                     batch_size=10))
  assert (ds.info["num_train"], ds.info["num_eval"]) == (50, 7)
  assert next(ds.train_iter())["y"].dtype == np.float32


# --- the stream ------------------------------------------------------------------------------


def test_determinism_by_seed_and_different_seeds_differ():
  def run(seed):
    return take(data.make_dataset(make_config("digits", seed=seed)).train_iter(), 3)
  a, b, c = run(0), run(0), run(1)
  assert_batches_equal(a, b)
  assert not np.array_equal(a[0]["y"], c[0]["y"])


def test_epochs_cover_the_data_once_and_reshuffle():
  from sklearn.datasets import make_moons  # imported here: 1.6 s at collection
  cfg = make_config("moons", n=105, batch_size=10, seed=3)  # 10 steps/epoch, 5 dropped
  ds = data.make_dataset(cfg)
  x_all = make_moons(n_samples=105, noise=0.25, random_state=42)[0].astype(np.float32)
  assert ds.info["steps_per_epoch"] == 10
  batches = take(ds.train_iter(), 30)
  epochs = [np.concatenate([row_ids(b, x_all) for b in batches[e * 10:(e + 1) * 10]])
            for e in range(3)]
  for ids in epochs:
    assert len(set(ids)) == 100  # no repeats inside an epoch
    # The documented rule: the epoch's rows are the first 100 of a (seed, epoch) permutation.
  for e, ids in enumerate(epochs):
    perm = np.random.default_rng(np.random.SeedSequence([3, e])).permutation(105)
    np.testing.assert_array_equal(ids, perm[:100])
  assert not np.array_equal(epochs[0], epochs[1])
  # shuffle=False: every epoch is rows 0..99 in order.
  plain = take(data.make_dataset(make_config("moons", n=105, batch_size=10,
                                             shuffle=False)).train_iter(), 20)
  ids = np.concatenate([row_ids(b, x_all) for b in plain])
  np.testing.assert_array_equal(ids, np.tile(np.arange(100), 2))


def test_set_state_resumes_exactly_across_epochs():
  ds = data.make_dataset(make_config("moons", n=100, batch_size=30, seed=7))  # 3 steps/epoch
  it = ds.train_iter()
  first = take(it, 3)
  state = json.loads(json.dumps(it.get_state()))
  assert all(isinstance(v, int) for v in state.values()) and state["step"] == 3
  rest = take(it, 4)
  fresh = ds.train_iter()
  fresh.set_state(state)
  assert_batches_equal(take(fresh, 4), rest)
  # Another build of the same config resumes the same way.
  again = data.make_dataset(make_config("moons", n=100, batch_size=30, seed=7)).train_iter()
  again.set_state(state)
  assert_batches_equal(take(again, 4), rest)
  assert not np.array_equal(first[0]["x"], rest[0]["x"])


def test_process_shards_concatenate_to_the_global_batch():
  ds = data.make_dataset(make_config("digits", batch_size=64, seed=2))
  glob = take(ds.train_iter(), 25)  # crosses the epoch boundary (22 steps/epoch)
  shards = [take(ds.train_iter(p, 2), 25) for p in range(2)]
  for s in range(25):
    assert shards[0][s]["x"].shape == (32, 8, 8, 1)
    for k in ("x", "y"):
      np.testing.assert_array_equal(
          np.concatenate([shards[0][s][k], shards[1][s][k]]), glob[s][k])
  # A 1-process checkpoint restores onto 2 processes (the state is the global step).
  one = ds.train_iter()
  take(one, 5)
  two = ds.train_iter(1, 2)
  two.set_state(one.get_state())
  np.testing.assert_array_equal(next(two)["y"], next(one)["y"][32:])


def test_eval_batches_pad_and_mask():
  ds = data.make_dataset(make_config("digits", eval_batch_size=100))
  evs = list(ds.eval_batches())
  assert len(evs) == len(ds.eval_batches()) == 4
  assert all(e["x"].shape == (100, 8, 8, 1) and e["mask"].dtype == np.float32 for e in evs)
  np.testing.assert_array_equal(evs[-1]["mask"], np.r_[np.ones(60), np.zeros(40)])
  (whole,) = list(ds.eval_batches(batch_size=360))
  real = np.concatenate([e["y"][e["mask"] == 1] for e in evs])
  np.testing.assert_array_equal(real, whole["y"])  # fixed order, padding dropped by the mask
  # Two processes: each gets half of every global batch.
  halves = [list(ds.eval_batches(100, p, 2)) for p in range(2)]
  for k in range(4):
    np.testing.assert_array_equal(
        np.concatenate([halves[0][k]["mask"], halves[1][k]["mask"]]), evs[k]["mask"])
  # Default (whole split) over 7 processes: rounded up to 364 rows, 4 padded.
  ds = data.make_dataset(make_config("digits"))
  parts = [list(ds.eval_batches(process_index=p, process_count=7)) for p in range(7)]
  assert sum(p[0]["mask"].sum() for p in parts) == 360 and parts[0][0]["x"].shape[0] == 52


# --- configs and errors ----------------------------------------------------------------------


def test_default_config_lists_every_key_and_type_checks_overrides():
  cfg = data.default_data_config("moons")
  assert set(cfg) >= {"name", "batch_size", "eval_batch_size", "shuffle", "n", "n_eval",
                      "noise", "data_seed"}
  cfg.lock()
  with pytest.raises(TypeError):
    cfg.n = "many"
  cfg.eval_batch_size = 50  # optional int placeholder accepts an int
  with pytest.raises(AttributeError):
    cfg.not_a_key = 1


@pytest.mark.parametrize("overrides, message", [
    (dict(name="mnist"), "data.name: unknown dataset 'mnist'"),
    (dict(bogus=1), "data.bogus: unknown key"),
    (dict(batch_size=1001), "data.batch_size: 1001 is larger than the training set"),
    (dict(batch_size=0), "data.batch_size: must be > 0"),
    (dict(noise="x"), "data.noise: expected float"),
    (dict(n=-5), "data.n: must be > 0"),
    (dict(n="3"), "data.n: expected int, got '3'"),
    (dict(shuffle=1), "data.shuffle: expected bool, got 1"),
    (dict(noise=-1), "data.noise: must be >= 0, got -1.0$"),
    (dict(n_eval=0), "data.n_eval: must be > 0, got 0"),
    (dict(data_seed=None), r"data.data_seed: must be set \(expected int\)"),
    (dict(name=""), "data.name: must be set; expected one of moons, digits"),
])
def test_config_errors(overrides, message):
  d = {**data.default_data_config("moons").to_dict(), **overrides}
  cfg = ml_collections.ConfigDict({"seed": 0, "data": d})
  with pytest.raises(ValueError, match=f"^{message}"):
    data.make_dataset(cfg)


def test_sharding_and_path_errors(tmp_path):
  ds = data.make_dataset(make_config("digits", batch_size=100))
  with pytest.raises(ValueError, match="^data.batch_size: global batch size 100 is not "
                                       "divisible by process_count 3"):
    ds.train_iter(0, 3)
  with pytest.raises(ValueError, match="^data.path: file not found"):
    data.make_dataset(make_config("npz", path=str(tmp_path / "missing.npz")))
  with pytest.raises(ValueError, match="^data.distribution: expected one of 'moons'"):
    data.make_dataset(make_config("toy2d", distribution="spiral"))
  it = ds.train_iter()
  state = it.get_state()
  other = data.make_dataset(make_config("digits", batch_size=50)).train_iter()
  with pytest.raises(ValueError, match="global_batch_size"):
    other.set_state(state)


def test_sources_are_typed_and_check_themselves():
  assert data.DATASETS == ("moons", "digits", "toy2d", "text", "textfile", "npz",
                           "assoc_recall", "digit_strings", "digit_tokens", "karate", "graph_npz",
                           "cycles_trees", "passkey", "arrayrecord", "stdlib_bpe",
                           "stdlib_instructions", "parquet", "hf_disk", "image_folder",
                           "npz_images")
  src = data.parse_data(make_config("toy2d", n=512).data)
  assert isinstance(src, data.sources.Toy2D) and (src.name, src.n, src.batch_size) == (
      "toy2d", 512, 256)
  # Built directly, a source refuses bad values as a parsed one does.
  with pytest.raises(ValueError,
                     match="^data.scale: expected one of 'unit', 'symmetric', got 'x'$"):
    data.sources.Digits(scale="x")
  with pytest.raises(ValueError, match="^data.batch_size: must be > 0"):
    data.sources.Text(batch_size=0)  # the base class's check holds under a new default
  cfg = data.default_data_config("text")
  assert (cfg.batch_size, cfg.eval_batch_size, cfg.max_bytes) == (32, 64, 2_000_000)
  with pytest.raises(TypeError, match="register a frozen dataclass"):
    data.register_source("loose")(type("Loose", (data.DataSource,), {}))  # no @dataclass
  with pytest.raises(ValueError, match="'moons' is registered twice"):
    data.register_source("moons")(data.sources.Moons)
  # A section read back from a run's config.json has JSON arrays for tuple fields.
  section = json.loads(json.dumps({"name": "digits", "augment": ("flip",)}))
  assert data.parse_data(section).augment == ("flip",)
  with pytest.raises(ValueError, match="^data.augment: expected tuple"):
    data.parse_data({"name": "digits", "augment": "flip"})
