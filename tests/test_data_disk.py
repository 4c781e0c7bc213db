"""Sources on disk: prepared ArrayRecord shards (text and images), Parquet, save_to_disk folders,
image folders and npz images; `jaxdl data prepare | tokenizer`; and their bad inputs."""

import itertools
import json
import os
import sysconfig

import ml_collections
import numpy as np
import pytest

from jaxdl import cli, data
from jaxdl.data import images, packing, prepare, sources, tokenize

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def make(name, **fields):
  section = data.default_data_config(name)
  for k, v in fields.items():
    section[k] = v
  return data.make_dataset(ml_collections.ConfigDict({"data": section, "seed": 3}))


def _docs():
  return {f"doc{i:02d}.txt": "".join(f"line {j}: {'ab' * (i % 5)} {i * j}\n"
                                     for j in range(4 + i % 6)) for i in range(30)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """A text folder prepared with a trained BPE (through the CLI), and an image folder."""
  root = tmp_path_factory.mktemp("disk")
  texts = root / "texts"
  texts.mkdir()
  for name, text in _docs().items():
    (texts / name).write_text(text)
  prep = root / "prep"
  assert cli.main(["data", "tokenizer", str(texts), "--vocab", "300", "--out", str(prep)]) == 0
  assert cli.main(["data", "prepare", str(texts), "--out", str(prep), "--shard-size", "7"]) == 0
  from PIL import Image
  rng = np.random.default_rng(0)
  for cls in ("cat", "dog", "owl"):
    (root / "imgs" / cls).mkdir(parents=True)
    for i in range(6):
      Image.fromarray(rng.integers(0, 256, (5, 4, 3), np.uint8)).save(
          root / "imgs" / cls / f"{i}.png")
  return root


def test_prepared_text_windows_are_the_packed_token_stream(files):
  manifest = json.loads((files / "prep" / "manifest.json").read_text())
  assert manifest["tokenizer"]["name"] == "bpe" and len(manifest["splits"]["train"]["files"]) > 1
  tok = tokenize.load_bpe(str(files / "prep" / "tokenizer.json"))
  # The same stream computed directly: documents in path order, split by crc32, joined with e.
  docs = _docs()
  train = [docs[n] for n in sorted(docs) if not prepare.in_val(n, 0.1)]
  stream_L = packing.join_documents(tok.encode_batch(train), tok.eot_id)
  assert manifest["splits"]["train"]["tokens"] + len(train) == len(stream_L)
  ds = make("arrayrecord", path=str(files / "prep"), context_length=12, batch_size=4,
            segment_ids=True, shuffle=False)
  assert ds.info["vocab_size"] == tok.vocab_size and ds.info["num_train"] == (
      len(stream_L) - 1) // 12
  it = ds.train_iter()
  for step in range(3):
    b = next(it)
    for r in range(4):
      start = (4 * step + r) * 12
      np.testing.assert_array_equal(b["x"][r], stream_L[start:start + 12])
      np.testing.assert_array_equal(b["y"][r], stream_L[start + 1:start + 13])
    seg, pos = packing.segment_positions(b["x"], tok.eot_id)
    np.testing.assert_array_equal(b["segment_ids"], seg)
    np.testing.assert_array_equal(b["positions"], pos)
  # Shuffled and sharded: two processes' rows make the global batch; the state resumes exactly.
  ds = make("arrayrecord", path=str(files / "prep"), context_length=12, batch_size=4)
  it, p0, p1 = ds.train_iter(), ds.train_iter(0, 2), ds.train_iter(1, 2)
  for _ in range(2):
    whole, a, b = next(it), next(p0), next(p1)
    np.testing.assert_array_equal(whole["x"], np.concatenate([a["x"], b["x"]]))
  state = it.get_state()
  expected = next(it)
  again = ds.train_iter()
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["x"], expected["x"])
  assert tok.decode(expected["x"][0])  # decodes with the same tokenizer


def test_text_folder_split_matches_the_stdlib_source():
  """Preparing the standard library's folder picks the same files and split as `text`."""
  root = sysconfig.get_paths()["stdlib"]
  docs = prepare.text_documents(root, pattern="*.py", max_bytes=60_000, val_frac=0.2)
  train_L, val_L = sources.stdlib_corpus(60_000, 0.2)
  assert "".join(docs["train"]).encode() == train_L.tobytes()
  assert "".join(docs["val"]).encode() == val_L.tobytes()


def test_images_prepared_folder_and_npz_agree_with_the_pixels(files, tmp_path):
  from PIL import Image
  root = files / "imgs"
  paths, labels, classes = images.list_folder(str(root))
  assert classes == ["cat", "dog", "owl"] and len(paths) == 18
  pixels = np.stack([np.asarray(Image.open(root / p)) for p in paths]).astype(np.float32) / 255
  # The image folder read batch by batch: its eval split is a seeded holdout of the files.
  ds = make("image_folder", path=str(root), eval_frac=0.25, batch_size=3)
  ev = next(iter(ds.eval_batches()))
  _, ev_idx = images.holdout(18, 0.25, 0)
  np.testing.assert_array_equal(ev["x"], pixels[ev_idx])
  np.testing.assert_array_equal(ev["y"], labels[ev_idx])
  assert ds.info["input_shape"] == (5, 4, 3) and ds.info["num_classes"] == 3
  # Prepared to shards: the train split is the files crc32 keeps out of val, in order.
  assert cli.main(["data", "prepare", str(root), "--out", str(tmp_path / "p"),
                   "--val-frac", "0.3", "--shard-size", "4"]) == 0
  ds = make("arrayrecord", path=str(tmp_path / "p"), batch_size=2, shuffle=False)
  keep = [i for i, p in enumerate(paths) if not prepare.in_val(p, 0.3)]
  got = [next(it) for it in [ds.train_iter()] for _ in range(len(keep) // 2)]
  np.testing.assert_array_equal(np.concatenate([g["x"] for g in got]), pixels[keep][:len(got) * 2])
  np.testing.assert_array_equal(np.concatenate([g["y"] for g in got]), labels[keep][:len(got) * 2])
  # An npz of uint8 images: x / 255 with a channel axis.
  np.savez(tmp_path / "im.npz", x=(pixels[..., 0] * 255).astype(np.uint8), y=labels)
  ds = make("npz_images", path=str(tmp_path / "im.npz"), batch_size=4, eval_frac=0.5)
  ev = next(iter(ds.eval_batches()))
  _, ev_idx = images.holdout(18, 0.5, 0)
  np.testing.assert_allclose(ev["x"], pixels[ev_idx][..., :1], atol=1e-7)


def test_image_folder_augments_like_the_npz_of_its_pixels(files, tmp_path):
  """`augment` on an image folder draws per record exactly what it draws on an npz of the same
  pixels (a different reader, the same records and seed), so resumed runs see the same images;
  evaluation stays un-augmented."""
  from PIL import Image
  root = files / "imgs"
  paths, labels, _ = images.list_folder(str(root))
  np.savez(tmp_path / "im.npz", x=np.stack([np.asarray(Image.open(root / p)) for p in paths]),
           y=labels)
  ops = ("crop=1", "flip", "jitter")
  common = dict(eval_frac=0.25, batch_size=4)
  folder = make("image_folder", path=str(root), augment=ops, **common)
  npz = make("npz_images", path=str(tmp_path / "im.npz"), augment=ops, **common)
  plain = make("image_folder", path=str(root), **common)
  for a, b, p in zip(*(itertools.islice(d.train_iter(), 4) for d in (folder, npz, plain))):
    np.testing.assert_allclose(a["x"], b["x"], atol=1e-6)
    np.testing.assert_array_equal(a["y"], p["y"])
    assert not np.allclose(a["x"], p["x"])
  for a, p in zip(folder.eval_batches(), plain.eval_batches()):
    np.testing.assert_array_equal(a["x"], p["x"])
  # Prepared images take the same field.
  assert cli.main(["data", "prepare", str(root), "--out", str(tmp_path / "p"),
                   "--val-frac", "0.3"]) == 0
  prepared = make("arrayrecord", path=str(tmp_path / "p"), augment=ops, batch_size=2)
  assert prepared.augment is not None and next(prepared.train_iter())["x"].shape == (2, 5, 4, 3)


def _write_hf(root, splits):
  """A DatasetDict laid out as `save_to_disk` writes it: arrow streams + state.json per split."""
  root.mkdir()
  (root / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
  for name, table in splits.items():
    (root / name).mkdir()
    with pa.OSFile(str(root / name / "data-00000-of-00001.arrow"), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (root / name / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": name}))


def test_parquet_and_save_to_disk_tables(tmp_path):
  texts = [f"row {i} " * (3 + i % 4) for i in range(40)]
  table = pa.table({"text": texts, "f1": np.arange(40.0), "f2": np.arange(40.0) ** 2,
                    "label": np.arange(40) % 3})
  pq.write_table(table, tmp_path / "t.parquet")
  # lm from a text column: bytes of the rows joined with e = 256; last 25% of rows held out.
  ds = make("parquet", path=str(tmp_path / "t.parquet"), context_length=8, batch_size=2,
            val_frac=0.25, shuffle=False)
  tok = tokenize.bytes_tokenizer()
  stream_L = packing.join_documents(tok.encode_batch(texts[:30]), 256)
  b = next(ds.train_iter())
  np.testing.assert_array_equal(b["x"], [stream_L[:8], stream_L[8:16]])
  assert ds.info["vocab_size"] == 257
  # Features and a label column.
  ds = make("parquet", path=str(tmp_path / "t.parquet"), kind="classification",
            columns="f1,f2", batch_size=30, shuffle=False)
  b = next(ds.train_iter())
  np.testing.assert_array_equal(b["x"], np.stack([np.arange(36.0), np.arange(36.0) ** 2], 1)[:30])
  assert ds.info["num_classes"] == 3 and ds.info["num_eval"] == 4
  # A save_to_disk DatasetDict with named splits.
  _write_hf(tmp_path / "hf", {"train": table.slice(0, 30), "test": table.slice(30)})
  ds = make("hf_disk", path=str(tmp_path / "hf"), eval_split="test", context_length=8,
            batch_size=2, shuffle=False)
  np.testing.assert_array_equal(next(ds.train_iter())["x"], [stream_L[:8], stream_L[8:16]])
  val_L = packing.join_documents(tok.encode_batch(texts[30:]), 256)
  np.testing.assert_array_equal(next(iter(ds.eval_batches()))["x"][0], val_L[:8])


def _bad_cases(files, tmp):
  """(what, callable, regex of the one-line error)."""
  prep = files / "prep"
  broken = tmp / "broken"
  broken.mkdir()
  for f in os.listdir(prep):
    (broken / f).write_bytes((prep / f).read_bytes())
  shard = sorted(broken.glob("train-*.array_record"))[0]
  shard.write_bytes(shard.read_bytes()[:-9])
  (tmp / "latin1").mkdir()
  (tmp / "latin1" / "a.txt").write_bytes("caf\xe9".encode("latin-1"))
  from PIL import Image
  odd, mixed = tmp / "odd", tmp / "mixed"
  (odd / "a").mkdir(parents=True)
  Image.fromarray(np.zeros((5, 4, 3), np.uint8)).save(odd / "a" / "0.png")
  Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(odd / "a" / "1.png")
  (mixed / "a").mkdir(parents=True)
  Image.fromarray(np.zeros((5, 4, 3), np.uint8)).save(mixed / "a" / "0.png")
  Image.fromarray(np.zeros((5, 4), np.uint8)).save(mixed / "a" / "1.png")
  garbled = tmp / "garbled"
  (garbled / "a").mkdir(parents=True)
  (garbled / "a" / "0.png").write_bytes(b"not a png")
  # Without its checksum the truncated shard reaches the ArrayRecord reader, which refuses it.
  unchecked = tmp / "unchecked"
  unchecked.mkdir()
  for f in os.listdir(broken):
    (unchecked / f).write_bytes((broken / f).read_bytes())
  manifest = json.loads((unchecked / "manifest.json").read_text())
  del manifest["checksum"][shard.name]
  (unchecked / "manifest.json").write_text(json.dumps(manifest))
  empty = tmp / "empty"
  empty.mkdir()
  for f in os.listdir(prep):
    (empty / f).write_bytes((prep / f).read_bytes())
  manifest = json.loads((empty / "manifest.json").read_text())
  manifest["splits"]["val"]["count"] = 0
  (empty / "manifest.json").write_text(json.dumps(manifest))
  return [
      ("empty", lambda: make("arrayrecord", path=str(empty)),
       r"^data.path: '.*empty': the manifest's val split is empty$"),
      ("missing", lambda: make("arrayrecord", path=str(tmp / "nope")),
       r"^data.path: directory not found: '.*nope'$"),
      ("not prepared", lambda: make("arrayrecord", path=str(tmp)),
       r"^data.path: '.*' has no manifest.json; prepare it with `jaxdl data prepare"),
      ("truncated", lambda: make("arrayrecord", path=str(broken)),
       r"^data.path: '.*train-00000-of-\d+.array_record' does not match the manifest's checksum"),
      ("tokenizer", lambda: make("arrayrecord", path=str(prep), tokenizer="bytes"),
       r"^data.tokenizer: 'bytes' is not the tokenizer '.*' was prepared with"),
      ("utf8", lambda: prepare.text_documents(str(tmp / "latin1")),
       r"^SRC: '.*a.txt' is not UTF-8 text \(byte 3"),
      ("image size", lambda: make("image_folder", path=str(odd)),
       r"^data.path: '.*1.png' is 5x5 \(width x height\) but the first image '.*0.png' is "
       r"4x5; every image must have one size: resize them$"),
      ("not an image", lambda: make("image_folder", path=str(garbled)),
       r"^data.path: cannot read '.*0.png' as an image: "),
      ("not an image, prepare", lambda: images.prepare_images(str(garbled), str(tmp / "g")),
       r"^SRC: cannot read '.*0.png' as an image: "),
      ("image mode", lambda: make("image_folder", path=str(mixed)),
       r"^data.path: '.*1.png' has mode L but the first image '.*0.png' has mode RGB; set "
       r"data.mode to L or RGB to convert every image$"),
      ("unreadable shard", lambda: make("arrayrecord", path=str(unchecked)),
       r"^data.path: cannot read the ArrayRecord shards \['train-00000"),
  ]


def test_bad_inputs_are_one_line_errors(files, tmp_path):
  for what, fn, pattern in _bad_cases(files, tmp_path):
    with pytest.raises(ValueError, match=pattern) as e:
      fn()
    assert "\n" not in str(e.value), what
  # data.mode converts: the mixed folder reads as grey images.
  assert make("image_folder", path=str(tmp_path / "mixed"), mode="L", eval_frac=0.5,
              batch_size=1).info["input_shape"] == (5, 4, 1)
  # A resumed run whose prepared data changed refuses, naming the change.
  state = make("arrayrecord", path=str(files / "prep"), context_length=12,
               batch_size=4).train_iter().get_state()
  changed = tmp_path / "changed"
  changed.mkdir()
  for name, text in _docs().items():
    (changed / name).write_text(text.replace("line 0", "line zero"))
  prepare.prepare_text(str(changed), str(tmp_path / "changed_prep"),
                       tokenizer=str(files / "prep" / "tokenizer.json"))
  it = make("arrayrecord", path=str(tmp_path / "changed_prep"), context_length=12,
            batch_size=4).train_iter()
  with pytest.raises(ValueError, match=r"^data iterator state: saved data_checksum=\w+ but this "
                                       r"pipeline has data_checksum=\w+; the saved step"):
    it.set_state(state)
  # pyarrow is the optional extra 'data': without it, one line naming how to install it.
  import sys
  saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "pyarrow"}
  sys.modules["pyarrow"] = None  # makes `import pyarrow` raise ImportError
  try:
    with pytest.raises(ValueError, match=r"needs pyarrow: pip install jaxdl\[data\]$"):
      make("parquet", path=str(tmp_path / "latin1" / "a.txt"))
  finally:
    del sys.modules["pyarrow"]
    sys.modules.update(saved)
  # Through the CLI: exit 2, one line, and no output directory is left behind.
  assert cli.main(["data", "prepare", str(tmp_path / "latin1"), "--out",
                   str(tmp_path / "out")]) == 2
  assert not (tmp_path / "out").exists()
