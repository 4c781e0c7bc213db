"""Prepared folders are whole or refused (`jaxdl.data.staging.check_out`, `jaxdl.data.staging`):
another tokenizer or source is refused with the folder unchanged, --force replaces it whole,
every shard names its tokenizer, a full disk leaves nothing, a killed cached build is swept.

Exit codes are asserted through the in-process `jaxdl.cli.main` (bad input: 2)."""

import hashlib
import json
import os
import subprocess

import ml_collections
import pytest

from jaxdl import cli, data
from jaxdl.data import prepare, staging, tokenize


def _snapshot(folder):
  """{relative path: sha256} of every file under `folder` (hidden ones included)."""
  out = {}
  for d, _, files in os.walk(folder):
    for f in files:
      path = os.path.join(d, f)
      with open(path, "rb") as fh:
        out[os.path.relpath(path, folder)] = hashlib.sha256(fh.read()).hexdigest()
  return out


def _one_error_line(capsys) -> str:
  err = [line for line in capsys.readouterr().err.splitlines()
         if line.strip() and "ex/s]" not in line]  # tqdm's bars are not messages
  assert len(err) == 1, err
  return err[0]


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
  """A text folder and two BPE tokenizers of it (TA: 270 ids, TB: 290)."""
  root = tmp_path_factory.mktemp("folders")
  (root / "texts").mkdir()
  for i in range(20):
    (root / "texts" / f"d{i:02d}.txt").write_text(f"hello world {i} and more text " * (3 + i))
  for name, vocab in (("TA", 270), ("TB", 290)):
    prepare.train_tokenizer(str(root / "texts"), str(root / name), vocab=vocab)
  return root


def _prepare(texts, out, *flags):
  return cli.main(["data", "prepare", str(texts / "texts"), "--out", str(out), "--shard-size",
                   "7", *flags])


def test_another_tokenizer_or_source_is_refused_and_force_replaces_it_whole(texts, tmp_path,
                                                                             capsys):
  out = tmp_path / "D"
  ta, tb = str(texts / "TA" / "tokenizer.json"), str(texts / "TB" / "tokenizer.json")
  assert _prepare(texts, out, "--tokenizer", ta) == 0
  before = _snapshot(out)
  capsys.readouterr()
  # The case: another tokenizer into the same folder.
  assert _prepare(texts, out, "--tokenizer", tb) == 2
  line = _one_error_line(capsys)
  assert "--tokenizer" in line and "another tokenizer" in line and "--force" in line, line
  assert _snapshot(out) == before
  # Another source into the same folder.
  other = tmp_path / "other"
  other.mkdir()
  for i in range(20):
    (other / f"o{i}.txt").write_text(f"other {i} " * 9)
  assert cli.main(["data", "prepare", str(other), "--out", str(out), "--tokenizer", ta]) == 2
  line = _one_error_line(capsys)
  assert "--out" in line and "prepared from" in line and str(other) in line, line
  assert _snapshot(out) == before
  # The same source and tokenizer again: prepared again, to the same bytes.
  assert _prepare(texts, out, "--tokenizer", ta) == 0
  assert _snapshot(out) == before
  # --force: TB's data and tokenizer.json, every shard naming TB's fingerprint, no TA leftovers.
  assert _prepare(texts, out, "--tokenizer", tb, "--shard-size", "30", "--force") == 0
  manifest = json.loads((out / "manifest.json").read_text())
  tb_sha = tokenize.load_bpe(tb).fingerprint
  assert tokenize.load_bpe(str(out / "tokenizer.json")).fingerprint == tb_sha
  shards = {f: s for split in manifest["splits"].values()
            for f, s in split["tokenizer_sha256"].items()}
  assert set(shards.values()) == {tb_sha}
  assert sorted(f for f in os.listdir(out) if f.endswith(".array_record")) == sorted(shards)


@pytest.mark.parametrize("tampered", ["a shard", "an older manifest"])
def test_training_refuses_data_of_another_tokenizer_naming_both(texts, tmp_path, tampered):
  out = tmp_path / "D"
  assert _prepare(texts, out, "--tokenizer", str(texts / "TA" / "tokenizer.json")) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  ta_sha = manifest["tokenizer"]["sha256"]
  if tampered == "a shard":  # shards from another preparation copied in, say
    shard = manifest["splits"]["val"]["files"][0]
    manifest["splits"]["val"]["tokenizer_sha256"][shard] = "f" * 64
    what = repr(str(out / shard))
  else:  # the folder, written before shards named their tokenizer
    for split in manifest["splits"].values():
      del split["tokenizer_sha256"]
    manifest["tokenizer"]["sha256"] = "f" * 64
    what = f"the data of {str(out)!r}"
  (out / "manifest.json").write_text(json.dumps(manifest))  # the manifest is not checksummed
  section = data.default_data_config("arrayrecord")
  section.path, section.context_length = str(out), 8
  want = (f"data.path: {what} was made with the tokenizer of sha256 ffffffffffff, but the "
          f"folder's tokenizer ({out / 'tokenizer.json'}) is sha256 {ta_sha[:12]}; prepare it "
          f"again with `jaxdl data prepare SRC --out {out} --force`")
  with pytest.raises(ValueError) as e:
    data.make_dataset(ml_collections.ConfigDict({"data": section, "seed": 0}))
  assert str(e.value) == want


def test_a_new_tokenizer_beside_prepared_data_is_refused(texts, tmp_path, capsys):
  out = tmp_path / "D"
  assert _prepare(texts, out, "--tokenizer", str(texts / "TA" / "tokenizer.json")) == 0
  before = _snapshot(out)
  capsys.readouterr()
  assert cli.main(["data", "tokenizer", str(texts / "texts"), "--vocab", "290", "--out",
                   str(out)]) == 2
  assert "holds data prepared with another tokenizer" in _one_error_line(capsys)
  assert _snapshot(out) == before


@pytest.mark.parametrize("flags,why", [
    (["--shard-size", "0"], "--shard-size: expected a positive integer"),
    (["--shard-size", "-5"], "--shard-size: expected a positive integer"),
    (["--max-bytes", "-1"], "--max-bytes: must be >= 0"),
])
def test_bad_numbers_are_one_line_exit_2_and_write_nothing(texts, tmp_path, capsys, flags, why):
  out = tmp_path / "out"
  assert cli.main(["data", "prepare", str(texts / "texts"), "--out", str(out), *flags]) == 2
  assert why in _one_error_line(capsys)
  assert not out.exists()


@pytest.fixture
def tiny_disk(tmp_path):
  """A 64 KiB tmpfs (root only; skipped where mounting is not permitted)."""
  disk = tmp_path / "disk"
  disk.mkdir()
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
  yield disk
  subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_leaves_nothing(texts, tiny_disk, tmp_path, capsys):
  big = tmp_path / "big"  # ~140 KB of tokens as uint16: more than the disk holds
  big.mkdir()
  for i in range(16):
    (big / f"b{i:02d}.txt").write_text("abcdefgh " * 500)
  kept = tiny_disk / "kept"
  kept.mkdir()
  (kept / "notes.txt").write_text("the user's own file")
  for out in (tiny_disk / "new", kept):
    assert cli.main(["data", "prepare", str(big), "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"--out {out}: no space left on device" in line and "nothing was written" in line
  assert sorted(os.listdir(tiny_disk)) == ["kept"] and os.listdir(kept) == ["notes.txt"]


def _dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def test_a_cached_build_sweeps_killed_builds_and_cleans_its_own_failure(tmp_path):
  path = str(tmp_path / "cache" / "ds")
  host = staging.socket.gethostname()
  killed = f"{path}.tmp-{host}-{_dead_pid()}"   # a build killed before it renamed
  running = f"{path}.tmp-{host}-{os.getppid()}"  # a build still running: left alone
  for d in (killed, running):
    os.makedirs(d)
  with open(f"{path}.tmp-{_dead_pid()}", "w") as f:  # a killed write of an earlier version
    f.write("half")

  def fail(tmp):
    os.makedirs(tmp)
    raise OSError(28, "No space left on device")
  with pytest.raises(OSError):
    staging.build_once(path, fail)
  assert sorted(os.listdir(tmp_path / "cache")) == [os.path.basename(running)]
  staging.build_once(path, lambda tmp: os.makedirs(os.path.join(tmp, "x")))
  assert os.listdir(path) == ["x"]
