"""`jaxdl data tokenizer` and `jaxdl data prepare` agree (one split, one set of refusals), and
small or malformed inputs are one-line errors naming the flag or key to change (issue 25, item
6). Data-only: nothing here trains."""

import json
import zlib

import ml_collections
import numpy as np
import pytest

from jaxdl import cli, data
from jaxdl.data import images, prepare, staging
from jaxdl.schema import ConfigError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")


def error_of(argv, capsys) -> str:
  """The one stderr line of a `jaxdl` command that exits 2."""
  capsys.readouterr()
  assert cli.main(argv) == 2, argv
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and err.startswith("jaxdl: error: "), err
  return err[len("jaxdl: error: "):]


def write_images(root, counts, shape=(8, 8)):
  rng = np.random.default_rng(0)
  for cls, n in counts.items():
    (root / cls).mkdir(parents=True)
    for i in range(n):
      Image.fromarray(rng.integers(0, 256, shape, np.uint8)).save(root / cls / f"{i}.png")
  return root


def test_tokenizer_and_prepare_split_a_small_parquet_alike(tmp_path, capsys):
  """Five rows: at the default --val-frac none is held out (row 2's crc32 / 2^32 = 0.1048 is the
  lowest), so both commands refuse in the same words, naming a --val-frac that works; with it
  both succeed."""
  src = tmp_path / "small.parquet"
  pq.write_table(pa.table({"text": [f"hello world {i} " * 5 for i in range(5)]}), src)
  assert min(zlib.crc32(str(i).encode()) / 2**32 for i in range(5)) == pytest.approx(0.1048, 1e-3)
  out = str(tmp_path / "out")
  tok = error_of(["data", "tokenizer", str(src), "--vocab", "270", "--out", out], capsys)
  prep = error_of(["data", "prepare", str(src), "--out", out], capsys)
  assert tok == prep == (f"--val-frac: 0.1 puts none of the 5 rows of {str(src)!r} in the val "
                         "split (one goes there when crc32(its row number) / 2^32 < val_frac); "
                         "set --val-frac 0.11 or more")
  split = ["--val-frac", "0.11"]
  assert cli.main(["data", "tokenizer", str(src), "--vocab", "270", "--out", out, *split]) == 0
  assert cli.main(["data", "prepare", str(src), "--out", out, *split]) == 0
  manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert manifest["tokenizer"]["name"] == "bpe"
  assert [manifest["splits"][s]["count"] for s in ("train", "val")] == [4, 1]


def test_prepare_refuses_a_tokenizer_trained_on_another_split(tmp_path, capsys):
  texts = tmp_path / "texts"
  texts.mkdir()
  for i in range(12):
    (texts / f"d{i:02d}.txt").write_text(f"document {i}: " + "abc " * (i + 3))
  out = tmp_path / "out"
  assert cli.main(["data", "tokenizer", str(texts), "--vocab", "270", "--out", str(out),
                   "--val-frac", "0.5"]) == 0
  record = json.loads((out / staging.TRAINED_ON).read_text())
  assert record["flags"]["--val-frac"] == 0.5 and record["source"] == str(texts)
  # Another split of the same files: val documents shaped the tokenizer.
  err = error_of(["data", "prepare", str(texts), "--out", str(out), "--val-frac", "0.3"], capsys)
  assert err.startswith(f"--tokenizer: {str(out / 'tokenizer.json')!r} was trained on another "
                        f"split of {str(texts)!r} (--val-frac 0.5 there, 0.3 here)"), err
  assert err.endswith(f"`jaxdl data tokenizer {texts} --out {out} --val-frac 0.3`"), err
  # The same flags, a train file changed since.
  train_file = next(f for f in sorted(p.name for p in texts.iterdir())
                    if not prepare.in_val(f, 0.5))
  (texts / train_file).write_text("rewritten")
  err = error_of(["data", "prepare", str(texts), "--out", str(out), "--val-frac", "0.5"], capsys)
  assert err.startswith(f"--tokenizer: {str(texts)!r} changed since"), err
  # OUT's own tokenizer.json trained on other files is refused; the same file passed by path is
  # a tokenizer reused on purpose, and accepted.
  other = tmp_path / "other"
  other.mkdir()
  for i in range(6):
    (other / f"o{i}.txt").write_text(f"other {i} " * 4)
  err = error_of(["data", "prepare", str(other), "--out", str(out), "--val-frac", "0.5"], capsys)
  assert "was trained on" in err and f"not {str(other)!r}" in err, err
  assert cli.main(["data", "prepare", str(other), "--out", str(tmp_path / "o"), "--val-frac",
                   "0.5", "--tokenizer", str(out / "tokenizer.json")]) == 0


def test_small_text_inputs_name_the_flag_to_change(tmp_path):
  texts = tmp_path / "texts"
  texts.mkdir()
  names = [f"d{i}.txt" for i in range(6)]
  for n in names:
    (texts / n).write_text("x" * 100)
  fracs = sorted(zlib.crc32(n.encode()) / 2**32 for n in names)
  with pytest.raises(ValueError, match=r"^--val-frac: 0.999 puts all of the 6 files of .* set "
                                       r"--val-frac (\S+) or less$") as e:
    prepare.text_documents(str(texts), val_frac=0.999)
  suggested = float(e.value.args[0].split()[-3])
  assert fracs[0] < suggested <= fracs[-1]  # the value suggested leaves both splits non-empty
  docs = prepare.text_documents(str(texts), val_frac=suggested)
  assert docs["train"] and docs["val"]
  # A --max-bytes cap that stops the reading early is named too.
  with pytest.raises(ValueError, match=r"or raise --max-bytes 150, which stopped the reading "
                                       r"after 2 files\)$"):
    prepare.text_documents(str(texts), max_bytes=150, val_frac=0.001)
  with pytest.raises(ValueError, match=r"^SRC: '.*one' holds 1 file; a train and a val split "
                                       r"need at least 2"):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_text("alone")
    prepare.text_documents(str(tmp_path / "one"))
  with pytest.raises(ValueError, match=r"^SRC: no file in '.*texts' matches --pattern '\*.md'$"):
    prepare.text_documents(str(texts), pattern="*.md")


def test_empty_class_folders_and_image_mismatches_are_named(tmp_path, capsys):
  empty = tmp_path / "empty"
  (empty / "cat").mkdir(parents=True)
  (empty / "dog").mkdir()
  err = error_of(["data", "prepare", str(empty), "--out", str(tmp_path / "o1")], capsys)
  assert err == (f"SRC: the class folders of {str(empty)!r} hold no images ('cat', 'dog': no "
                 ".png/.jpg/.jpeg files), and no file matches --pattern '*.txt'")
  some = write_images(tmp_path / "some", {"ants": 3, "bees": 3})
  (some / "wasps").mkdir()
  err = error_of(["data", "prepare", str(some), "--out", str(tmp_path / "o2")], capsys)
  assert err.startswith(f"SRC: class folder 'wasps' of {str(some)!r} holds no images"), err
  with pytest.raises(ValueError, match=r"^data.path: class folder 'wasps' of .* holds no images"):
    images.list_folder(str(some))
  (some / "wasps").rmdir()
  # Size and mode mismatches, each named as such with the caller's own flag or key.
  Image.fromarray(np.zeros((9, 8), np.uint8)).save(some / "ants" / "9.png")
  err = error_of(["data", "prepare", str(some), "--out", str(tmp_path / "o3")], capsys)
  assert err.startswith(f"SRC: {str(some / 'ants' / '9.png')!r} is 8x9 (width x height) but the "
                        f"first image {str(some / 'ants' / '0.png')!r} is 8x8; every image must "
                        "have one size"), err
  (some / "ants" / "9.png").unlink()
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(some / "bees" / "9.png")
  err = error_of(["data", "prepare", str(some), "--out", str(tmp_path / "o4")], capsys)
  assert err.endswith("has mode RGB but the first image "
                      f"{str(some / 'ants' / '0.png')!r} has mode L; set --mode to L or RGB to "
                      "convert every image"), err
  with pytest.raises(ValueError, match=r"has mode L; set data.mode to L or RGB to convert"):
    images.check_images(str(some), images.list_folder(str(some))[0], "")
  assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))  # nothing written


def test_a_small_image_folder_names_the_batch_key(tmp_path, capsys):
  """27 images, default batch 128: refused (never shrunk silently), naming data.batch_size, the
  image count and a batch that fits; in place, prepared, and through `jaxdl train`."""
  root = write_images(tmp_path / "imgs", {"a": 14, "b": 13})
  section = data.default_data_config("image_folder")
  section.path = str(root)
  with pytest.raises(ConfigError, match=r"^data.batch_size: 128 is larger than the training set "
                                        rf"\(24 images in {str(root)!r}, 3 more held out by "
                                        r"data.eval_frac\); set data.batch_size to at most 24, "
                                        r"e.g. --set data.batch_size=16$"):
    data.make_dataset(ml_collections.ConfigDict({"data": section, "seed": 0}))
  prepared = tmp_path / "prepared"
  assert cli.main(["data", "prepare", str(root), "--out", str(prepared)]) == 0
  err = error_of(["train", f"digits_cnn:data={prepared}", "--workdir", str(tmp_path / "run"),
                  "--no-progress"], capsys)
  n = json.loads((prepared / "manifest.json").read_text())["splits"]["train"]["count"]
  assert err == (f"data.batch_size: 128 is larger than the training set ({n} images in the "
                 f"train split of {str(prepared)!r}); set data.batch_size to at most {n}, e.g. "
                 "--set data.batch_size=16")
