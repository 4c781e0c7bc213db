"""The README's "Your own data" commands, run verbatim on a text folder and an image folder the
test writes; only the training length and the GPT's size are shrunk (`--set`), so it costs
seconds."""

import json
import pathlib
import re
import shlex

import numpy as np
import pytest

from jaxdl import cli

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SHORT = ["train.steps=2", "train.eval_every=0", "train.ckpt_every=0", "train.plot=False"]


def readme_commands(marker: str) -> list[list[str]]:
  """The `jaxdl ...` lines of the ```sh block between <!-- byod:MARKER --> and its end."""
  text = README.read_text()
  found = re.search(rf"<!-- byod:{marker} -->\n```sh\n(.*?)```\n<!-- /byod:{marker} -->", text,
                    re.S)
  assert found, f"README.md has no <!-- byod:{marker} --> sh block"
  lines = [shlex.split(line) for line in found.group(1).splitlines() if line.strip()]
  assert all(line[0] == "jaxdl" for line in lines), lines
  return [line[1:] for line in lines]


def run_all(commands: list[list[str]], extra: list[str]) -> None:
  for argv in commands:
    if argv[0] == "train":
      argv = [*argv, "--no-progress", *(a for kv in extra for a in ("--set", kv))]
    assert cli.main(argv) == 0, argv


def summary_of(tmp_path) -> dict:
  (path,) = tmp_path.glob("runs/*/summary.json")
  return json.loads(path.read_text())


def test_text_folder_to_a_trained_gpt(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "my_texts").mkdir()
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "naïve", "café", "x = 1", "def f():"]
  for i in range(40):
    text = " ".join(rng.choice(words, 60)) + "\n"
    (tmp_path / "my_texts" / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
  commands = readme_commands("text")
  assert [c[:2] for c in commands] == [["data", "tokenizer"], ["data", "prepare"],
                                       ["train", "bpe_gpt:data=my_data"]]
  run_all(commands, [*SHORT, "model.n_layer=1", "model.d_model=32", "model.n_head=2"])
  manifest = json.loads((tmp_path / "my_data" / "manifest.json").read_text())
  assert manifest["tokenizer"]["name"] == "bpe"
  ev = summary_of(tmp_path)["eval"]
  # Per byte, not per token: the BPE's tokens hold more than one byte each.
  assert 0 < ev["bits_per_byte"] < ev["loss"] / np.log(2)


def test_image_folder_to_a_trained_cnn(tmp_path, monkeypatch):
  from PIL import Image
  monkeypatch.chdir(tmp_path)
  rng = np.random.default_rng(0)
  for cls in ("ants", "bees", "wasps"):
    (tmp_path / "my_images" / cls).mkdir(parents=True)
    for i in range(14):
      Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).save(
          tmp_path / "my_images" / cls / f"{i}.png")
  commands = readme_commands("images")
  assert [c[:2] for c in commands] == [["data", "prepare"],
                                       ["train", "digits_cnn:data=my_images_data"]]
  run_all(commands, [*SHORT, "data.batch_size=8"])
  s = summary_of(tmp_path)
  assert s["step"] == 2 and np.isfinite(s["eval"]["loss"])


def test_a_folder_that_is_not_prepared_is_named(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "my_images_data").mkdir()
  capsys.readouterr()
  assert cli.main(["train", "digits_cnn:data=my_images_data", "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "my_images_data" in err[0] and "manifest.json" in err[0], err
  assert not (tmp_path / "runs").exists()


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
