"""Permission errors met by an unprivileged user, for real: the test creates a user (`useradd`)
and runs the `jaxdl` program as that user against folders owned by root (mode 755), which root
itself could write. Checked: a workdir in a folder the user cannot write and `jaxdl data prepare
--out` there are each refused in one line, exit 2, nothing created; a run whose `checkpoints/`
it cannot write ends with its one line (exit 1) within seconds, not after orbax's timeouts.

(tests/test_bad_inputs.py and tests/test_faults.py check the same refusals as root, who is only
stopped by a folder with no write bits or a read-only file system.)
"""

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import jax
import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _reachable_by_others(path: str) -> bool:
  """Whether a user who owns none of `path`'s folders can enter each of them (search bit)."""
  p = pathlib.Path(path).resolve()
  return all(os.stat(d).st_mode & stat.S_IXOTH for d in [*reversed(p.parents), p]
             if d.is_dir())


@pytest.fixture(scope="module")
def user():
  """(run, area): `run(argv, **kw)` runs `python -m jaxdl *argv` as a user created here, with
  a HOME and caches of its own; `area` is a folder (root's, mode 755) for the test's files.
  The user and the area are removed afterwards."""
  if os.geteuid() != 0:
    pytest.skip("creating a user needs root (the suite runs as an unprivileged user: its "
                "permission errors are real already)")
  if not (shutil.which("useradd") and shutil.which("userdel")):
    pytest.skip("useradd/userdel not installed: cannot create an unprivileged user")
  # pytest's tmp_path is mode 700 (root's): the user could not enter it.
  area = pathlib.Path(tempfile.mkdtemp(prefix="jaxdl-perm-"))
  area.chmod(0o755)
  name = f"jaxdl{os.getpid()}"
  home = area / "home"
  made = subprocess.run(["useradd", "--user-group", "--no-create-home", "--home-dir", str(home),
                         "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
  if made.returncode != 0:
    shutil.rmtree(area)
    pytest.skip(f"useradd failed: {made.stderr.strip()}")
  try:
    import pwd
    entry = pwd.getpwnam(name)
    home.mkdir()
    os.chown(home, entry.pw_uid, entry.pw_gid)
    # The user must read the interpreter, the venv and the repository. Where the interpreter
    # lies in a folder others cannot enter (a pyenv under root's 700 home), the user gets the
    # one capability to read and search any file (CAP_DAC_READ_SEARCH): it grants no write, so
    # every permission error below is still the user's own.
    needed = [sys.executable, os.path.dirname(os.__file__), os.path.dirname(jax.__file__),
              str(ROOT)]
    if all(_reachable_by_others(p) for p in needed):
      prefix, as_user = [], dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
    elif shutil.which("setpriv"):
      prefix, as_user = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}",
                         "--clear-groups", "--inh-caps=+dac_read_search",
                         "--ambient-caps=+dac_read_search", "--"], {}
    else:
      pytest.skip(f"the interpreter {sys.executable} is in a folder other users cannot enter, "
                  "and setpriv (to let the user read it) is not installed")
    # One CPU device and the suite's fast-compile flags; caches in the user's HOME (the suite's
    # XLA cache is root's: a miss would try to write there and warn on stderr).
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = {**os.environ, "HOME": str(home), "USER": name, "LOGNAME": name,
           "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags),
           "JAXDL_CACHE": str(home / "jaxdl"), "JAX_COMPILATION_CACHE_DIR": str(home / "xla"),
           "MPLCONFIGDIR": str(home / "mpl")}

    def run(argv, timeout=120):
      return subprocess.run([*prefix, sys.executable, "-m", "jaxdl", *argv], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout, **as_user)

    probe = run(["--help"])
    assert probe.returncode == 0, probe.stderr[-2000:]
    yield run, area, entry
  finally:
    subprocess.run(["userdel", name], capture_output=True)
    shutil.rmtree(area, ignore_errors=True)


def _root_only(area: pathlib.Path, name: str) -> pathlib.Path:
  """A folder owned by root, mode 755: readable by the user, not writable."""
  folder = area / name
  folder.mkdir(mode=0o755)
  folder.chmod(0o755)
  return folder


def _one_line(proc) -> str:
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  return lines[0]


def test_a_workdir_the_user_cannot_create_is_refused_in_one_line(user):
  run, area, _ = user
  locked = _root_only(area, "locked_runs")
  proc = run(["train", "moons_mlp:smoke", "--workdir", str(locked / "run"), "--no-progress"])
  line = _one_line(proc)
  assert proc.returncode == 2 and line.startswith("jaxdl: error: ") and str(locked) in line, line
  assert "not writable by this user (permission denied)" in line, line
  assert os.listdir(locked) == []  # nothing created


def test_data_prepare_out_the_user_cannot_write_is_refused_in_one_line(user):
  run, area, _ = user
  texts = area / "texts"
  texts.mkdir(mode=0o755)
  for i in range(3):
    (texts / f"doc{i}.txt").write_text(f"document {i}: the quick brown fox\n" * 3)
  locked = _root_only(area, "locked_data")
  proc = run(["data", "prepare", str(texts), "--out", str(locked / "prep")])
  line = _one_line(proc)
  assert proc.returncode == 2 and "--out" in line and str(locked) in line, line
  assert "not writable by this user (permission denied)" in line, line
  assert os.listdir(locked) == []


def test_checkpoints_the_user_cannot_write_end_the_run_in_seconds_with_one_line(user):
  """The workdir is the user's, its checkpoints/ root's: the first save fails with EACCES. The
  program reports it in one line and exits 1 at once (orbax's threads of the failed save would
  otherwise hold the interpreter's exit for minutes), its lock released."""
  run, area, entry = user
  workdir = area / "w"
  workdir.mkdir(mode=0o755)
  os.chown(workdir, entry.pw_uid, entry.pw_gid)
  ckpts = _root_only(workdir, "checkpoints")
  t0 = time.monotonic()
  proc = run(["train", "moons_mlp:smoke", "--workdir", str(workdir), "--no-progress",
              "--set", "train.steps=2", "--set", "train.plot=False"], timeout=90)
  line = _one_line(proc)
  assert proc.returncode == 1 and str(ckpts) in line and "permission denied" in line, line
  assert time.monotonic() - t0 < 60, "the run outlived its failed save"
  assert os.listdir(ckpts) == [] and not (workdir / ".lock").exists()
