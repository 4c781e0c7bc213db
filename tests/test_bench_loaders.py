"""The PyTorch DataLoader baseline of `jaxdl bench` (`jaxdl.bench.loaders`): without torch, its
row says how to enable it, and its datasets and sampler make exactly grain's batches; with torch,
the DataLoader itself runs. Speed is measured in `jaxdl bench`, never here."""

import numpy as np
import pytest

from jaxdl import data
from jaxdl.bench import benches, loaders
from jaxdl.config import base_config
from jaxdl.data import prepare


def _same(grain_batch, ours):
  assert list(grain_batch) == list(ours)
  for k, v in grain_batch.items():
    assert v.dtype == ours[k].dtype and v.shape == ours[k].shape, k
    np.testing.assert_array_equal(v, ours[k], err_msg=k)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
  """Documents of 3 .. 60 bytes prepared with the bytes tokenizer in 3 shards, read as 8-token
  windows with segment ids, batch 4, seed 3: (dataset, the DataLoader's records)."""
  root = tmp_path_factory.mktemp("loaders")
  (root / "docs").mkdir()
  for i in range(24):
    (root / "docs" / f"d{i:02d}.txt").write_text("".join(chr(97 + (i * j) % 26)
                                                         for j in range(3 + (i * 7) % 58)))
  prepare.prepare_text(str(root / "docs"), str(root / "prep"), tokenizer="bytes", shard_size=8)
  config = base_config()
  config.seed = 3
  config.data = data.default_data_config("arrayrecord")
  config.data.update(path=str(root / "prep"), context_length=8, batch_size=4, segment_ids=True)
  ds = data.make_dataset(config)
  return ds, loaders.TextWindows(str(root / "prep"), 8)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
  """48 prepared 6 x 5 RGB records, crop, flip and jitter, batch 8: (dataset, records)."""
  root = str(tmp_path_factory.mktemp("loader_images"))
  loaders.prepare_images(root, num=48, shape=(6, 5, 3), classes=3)
  ds = loaders.image_dataset(root, ("crop=2", "flip", "jitter"), batch=8)
  return ds, loaders.ImageRecords(root, ds.augment)


def test_without_torch_one_row_says_how_to_enable_it(monkeypatch):
  monkeypatch.setattr(loaders, "torch_available", lambda: False)
  r = loaders.bench_dataloader()
  rows = benches._dataloader_rows("data", r)
  assert len(rows) == 1 and rows[0]["met"] is None and rows[0]["ratio"] is None
  assert 'pip install -e ".[bench]"' in rows[0]["measure"]


@pytest.mark.parametrize("fixture", ["text", "images"])
def test_the_dataloaders_work_is_grains_batch_for_batch(fixture, request):
  """Collating the records of StepRows' step s is train_iter()'s batch s, bit for bit, over more
  than two epochs (fresh permutations, new augmentation draws)."""
  ds, records = request.getfixturevalue(fixture)
  steps = loaders.StepRows.of(ds)
  it = ds.train_iter()
  n = 2 * ds.info["steps_per_epoch"] + 1
  for s, rows in zip(range(n), steps):
    assert rows == steps.rows(s) and {e for e, _ in rows} == {s // ds.info["steps_per_epoch"]}
    _same(next(it), records.collate([records[i] for i in rows]))
  assert len(records) == ds.source.train.num


def test_image_records_refuse_mixing(images):
  ds, records = images
  mixing = type(ds.augment)({**ds.augment.ops, "mixup": 0.2}, 0, 3)
  with pytest.raises(ValueError, match="record-level ops only"):
    loaders.ImageRecords(records.directory, mixing)


def test_the_torch_dataloader_runs_the_same_batches(text, images):
  pytest.importorskip("torch")
  for ds, records in (text, images):
    for workers in (0, 2):
      it = ds.train_iter()
      for _, batch in zip(range(3), loaders.dataloader(records, loaders.StepRows.of(ds), workers)):
        _same(next(it), batch)
  ds, records = text
  r = loaders.compare(ds, records, workers=(0, 1), batches=2, rounds=1, warm=1)
  assert set(r) == {0, 1} and all(x["grain"] > 0 and x["dataloader"] > 0 for x in r.values())
  assert "ratio_cpu" in r[0] and "ratio_cpu" not in r[1]


def test_grains_worker_stream_is_the_in_process_stream(text):
  """`grain_batches` at one worker (a spawned process) yields train_iter()'s batches bit for bit
  (its keys come back sorted). The text batch's arrays, all under SHM_MIN_BYTES, arrive pickled:
  plain numpy arrays, where grain's default (min_shm_size 0) hands three of the five back as its
  shared-memory `SharedMemoryArray`."""
  ds, _ = text
  it, workers = ds.train_iter(), loaders.grain_batches(ds, 1)
  try:
    for _ in range(3):
      batch, theirs = next(it), next(workers)
      assert sorted(theirs) == sorted(batch)
      assert all(type(v) is np.ndarray for v in theirs.values()), {
          k: type(v).__name__ for k, v in theirs.items()}
      _same(batch, {k: theirs[k] for k in batch})
  finally:
    workers.close()


def test_the_readme_copies_the_dataloader_medians_from_the_loaders_docstring():
  """One number, one place: the medians of `jaxdl.bench.loaders`' measured block, as the
  README's `data` row states them."""
  import pathlib
  import re
  readme = " ".join((pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
                    .split())
  stated = dict((name, medians) for name, *medians in re.findall(
      r"^\s+(packed BPE|images)\s+0 workers ([\d.]+)x \(.*?\), 2 workers ([\d.]+)x",
      loaders.__doc__, flags=re.M))
  assert sorted(stated) == ["images", "packed BPE"]
  text_0, text_2 = stated["packed BPE"]
  images_0, images_2 = stated["images"]
  assert (f"text {text_0}x at 0 workers, {text_2}x at 2; images {images_0}x at 0 workers, "
          f"{images_2}x at 2") in readme
