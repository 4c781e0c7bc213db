"""Sources read in place, chosen from the command line: `jaxdl train EXP --set data.name=KIND
--set data.path=...` re-writes the experiment's data section for that source (its own keys at
their defaults, the experiment's batch size kept), for every kind on disk, and trains."""

import json

import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import ConfigError, load_config

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

def _summary(out: str) -> dict:
  """The CLI's closing JSON (an experiment may print a sample before it)."""
  return json.loads(out[out.rindex('{\n  "workdir"'):])


SMOKE = ["--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "train.ckpt_every=2",
         "--set", "train.plot=False", "--no-progress"]


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
  """A Parquet table, a save_to_disk folder, a text folder prepared as ArrayRecord shards, an
  image folder (3 classes of 5x4 RGB) and the same pixels as an npz."""
  from PIL import Image
  root = tmp_path_factory.mktemp("inplace")
  texts = [f"def f{i}(x):\n    return x * {i}\n" for i in range(40)]
  table = pa.table({"text": texts})
  pq.write_table(table, root / "t.parquet")
  hf = root / "hf"
  (hf / "train").mkdir(parents=True)
  (hf / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
  with pa.OSFile(str(hf / "train" / "data-00000-of-00001.arrow"), "wb") as sink:
    with pa.ipc.new_stream(sink, table.schema) as writer:
      writer.write_table(table)
  (hf / "train" / "state.json").write_text(json.dumps(
      {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"}))
  (root / "docs").mkdir()
  for i, text in enumerate(texts):
    (root / "docs" / f"d{i:02d}.txt").write_text(text * 3)
  assert cli.main(["data", "tokenizer", str(root / "docs"), "--vocab", "300", "--out",
                   str(root / "prep")]) == 0
  assert cli.main(["data", "prepare", str(root / "docs"), "--out", str(root / "prep")]) == 0
  rng = np.random.default_rng(0)
  x, y = [], []
  for k, cls in enumerate(("cat", "dog", "owl")):
    (root / "imgs" / cls).mkdir(parents=True)
    for i in range(8):
      pixels = rng.integers(0, 256, (5, 4, 3), np.uint8)
      Image.fromarray(pixels).save(root / "imgs" / cls / f"{i}.png")
      x.append(pixels), y.append(k)
  np.savez(root / "imgs.npz", x=np.stack(x), y=np.array(y))
  return root


# One model for the three text sources (257 byte ids, 300 BPE ids): one GPT of one layer whose
# programs the three trainings share.
TEXT_MODEL = ["model.vocab_size=300", "model.n_layer=1", "data.context_length=16"]


@pytest.mark.slow
@pytest.mark.parametrize("kind, path", [("parquet", "t.parquet"), ("hf_disk", "hf"),
                                        ("arrayrecord", "prep")])
def test_a_text_source_on_disk_trains_the_gpt(kind, path, disk, tmp_path, capsys):
  sets = [a for kv in [f"data.name={kind}", f"data.path={disk / path}", "data.batch_size=4",
                       *TEXT_MODEL] for a in ("--set", kv)]
  assert cli.main(["train", "char_gpt:smoke", "--workdir", str(tmp_path), *sets, *SMOKE]) == 0
  summary = _summary(capsys.readouterr().out)
  assert summary["step"] == 2 and np.isfinite(summary["eval"]["loss"])
  assert json.loads((tmp_path / "config.json").read_text())["data"]["name"] == kind


@pytest.mark.slow
@pytest.mark.parametrize("kind, path", [("image_folder", "imgs"), ("npz_images", "imgs.npz")])
def test_an_image_source_on_disk_trains_the_cnn(kind, path, disk, tmp_path, capsys):
  sets = [a for kv in [f"data.name={kind}", f"data.path={disk / path}", "data.batch_size=8",
                       "data.augment=('flip',)", "model.features=(8,)", "model.hidden=0"]
          for a in ("--set", kv)]
  assert cli.main(["train", "digits_cnn:smoke", "--workdir", str(tmp_path), *sets, *SMOKE]) == 0
  summary = _summary(capsys.readouterr().out)
  assert summary["step"] == 2 and 0 <= summary["eval"]["accuracy"] <= 1


def test_switching_the_source_rewrites_the_section_and_keeps_refusing_typos():
  config, _ = load_config("digits_cnn", ["data.path=imgs", "data.name=image_folder"])
  assert (config.data.name, config.data.path, config.data.eval_frac) == ("image_folder", "imgs",
                                                                          0.1)
  assert "scale" not in config.data  # the digits' own key is gone with the digits
  assert config.data.batch_size == load_config("digits_cnn")[0].data.batch_size
  with pytest.raises(ConfigError, match="^data.pathh: unknown key$"):
    load_config("digits_cnn", ["data.name=image_folder", "data.pathh=imgs"])
  with pytest.raises(ConfigError, match="^data.name: unknown dataset 'imagefolder'; expected"):
    load_config("digits_cnn", ["data.name=imagefolder"])


def test_data_the_model_cannot_represent_is_refused_before_compiling(disk, tmp_path, capsys):
  """Byte-tokenized text has 257 ids (256 bytes + end-of-text): char_gpt's 256-entry model would
  index past its table (a NaN at step 2 before this check); ten digit classes into a 5-way head
  likewise. One line, exit 2, nothing written."""
  for argv, message in (
      (["char_gpt:smoke", "--set", "data.name=parquet", "--set", f"data.path={disk / 't.parquet'}",
        "--set", "data.context_length=16"],
       "model.vocab_size: the data has 257 token ids (0..256) but the model has 256; set "
       "model.vocab_size=257"),
      (["digits_cnn:smoke", "--set", "model.out=5"],
       "model.out: the data has 10 classes (labels 0..9) but the model has 5 outputs; set "
       "model.out=10")):
    workdir = tmp_path / argv[0].replace(":", "-")
    assert cli.main(["train", *argv, "--workdir", str(workdir), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == f"jaxdl: error: {message}"
    assert not workdir.exists()
