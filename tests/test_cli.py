"""The `jaxdl` command package: ordinary imports, a light --help, exit codes from error types."""

import ast
import errno
import gc
import pathlib
import subprocess
import sys

import pytest

from jaxdl import cli, disk_errors, stop_signals
from jaxdl.bench import startup
from jaxdl.cli import listing
from jaxdl.schema import ConfigError
from jaxdl.train import errors

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxdl"


def _heavy_loaded_after(argv: list[str]) -> list[str]:
  """Which of jax and the sweep package `python -m jaxdl ARGV` imports, in a fresh interpreter
  (the program: a run a sweep started is the only one that imports the sweep package first)."""
  code = ("import runpy, sys\nsys.argv = ['jaxdl', *%r]\ntry:\n"
          "  runpy.run_module('jaxdl', run_name='__main__')\nexcept SystemExit:\n  pass\n"
          "print('LOADED', *[m for m in ('jax', 'jaxdl.course.sweeps', 'jaxdl.sweep') "
          "if m in sys.modules])" % (argv,))
  out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                       capture_output=True, text=True).stdout
  return out.split("LOADED")[-1].split()


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["sweep", "--help"], ["list"]])
def test_help_and_list_import_no_jax_and_no_sweep_package(argv):
  assert _heavy_loaded_after(argv) == []


def test_a_program_freezes_the_library_heap_and_a_python_caller_keeps_its_own(monkeypatch):
  """`python -m jaxdl CMD` (argv None) imports the library with the collector paused and
  freezes what it made (`load_library_frozen`: about 260k objects), then turns the collector
  back on; `jaxdl list` loads no library to freeze, the startup bench's baseline process freezes
  nothing, and `cli.main(argv)` from Python leaves the caller's heap alone. The speed is `jaxdl
  bench --only startup`'s."""
  code = ("import gc, sys\nfrom jaxdl import cli\n"
          "sys.argv = ['jaxdl', *sys.argv[1:]]\nrc = cli.main()\n"
          "print(rc, gc.isenabled(), gc.get_freeze_count(), 'jax' in sys.modules)")

  def run(*argv):
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True, timeout=120,
                         capture_output=True, text=True).stdout.split()
    return int(out[-4]), out[-3] == "True", int(out[-2]), out[-1] == "True"

  # An unknown experiment: bad input (2), refused after the library loaded.
  rc, enabled, frozen, jax_loaded = run("train", "no_such_experiment")
  assert (rc, enabled, jax_loaded) == (2, True, True) and frozen > 100_000
  assert run("list")[1:] == (True, 0, False)
  # `jaxdl bench --only startup`'s baseline process: the same program, the freeze switched off
  # (it prints at exit, as the baseline ends in sys.exit).
  baseline = ("import atexit, gc, sys\natexit.register(lambda: print('frozen', "
              "gc.get_freeze_count()))\n" + startup._UNFROZEN)
  done = subprocess.run([sys.executable, "-c", baseline, "train", "no_such_experiment"],
                        timeout=120, capture_output=True, text=True)
  assert done.returncode == 2 and done.stdout.split()[-2:] == ["frozen", "0"], done.stderr
  calls = []
  monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
  monkeypatch.setattr(gc, "disable", lambda: calls.append("disable"))
  assert cli.main(["train", "no_such_experiment"]) == 2
  assert calls == [] and gc.isenabled()


def test_every_command_help_is_light():
  code = ("import sys\nfrom jaxdl import cli\np = cli.build_parser()\n"
          "for name in cli.COMMANDS:\n  try:\n    p.parse_args([name, '--help'])\n"
          "  except SystemExit:\n    pass\nprint('JAX' if 'jax' in sys.modules else 'NOJAX')")
  out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                       capture_output=True, text=True).stdout
  assert out.split()[-1] == "NOJAX"


def test_every_command_is_a_module_with_help_arguments_and_main():
  assert list(cli.COMMANDS) == ["train", "list", "sample", "generate", "nfe", "likelihood",
                                "doctor", "reproduce", "bench", "data", "plot", "sweep", "export",
                                "eval"]
  for name, module in cli.COMMANDS.items():
    assert module.__name__.startswith("jaxdl.cli."), name
    assert isinstance(module.HELP, str) and callable(module.add_arguments), name
    assert callable(module.main), name


def test_no_jaxdl_module_is_imported_by_string():
  """Registration and commands follow from import statements: no `import_module` or
  `__import__` of a jaxdl module anywhere in the package (pyarrow's optional import is not one)."""
  found = []
  for path in sorted(ROOT.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call):
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name in ("import_module", "__import__"):
          arg = node.args[0] if node.args else None
          literal = arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg or node)
          if "pyarrow" not in literal:
            found.append(f"{path.relative_to(ROOT.parent)}: {ast.unparse(node)}")
  assert not found, found


def test_config_flags_become_set_overrides():
  assert cli.split_config_flags(["train", "--config.optim.lr=3e-3", "--config.seed", "7"]) == [
      "train", "--set", "optim.lr=3e-3", "--set", "seed=7"]


def test_a_failed_run_is_a_run_error_and_bad_input_a_value_error():
  from jaxdl.schema import ConfigError
  from jaxdl.train import DiskFailure, NonFiniteLossError, PreflightError, RunError, SpikeError
  for kind in (NonFiniteLossError, SpikeError, PreflightError, DiskFailure):
    assert issubclass(kind, RunError), kind
  assert issubclass(ConfigError, ValueError) and not issubclass(ConfigError, RunError)


def test_a_full_disk_in_the_training_timeline_is_a_disk_failure_naming_the_file():
  full = OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl")
  with pytest.raises(errors.DiskFailure) as caught:
    with errors.disk_failures_fail_the_run("/w"):
      raise full
  assert caught.value.__cause__ is full
  assert str(caught.value) == "no space left on device: /w/metrics.jsonl"
  # The CLI's one line still finds the file under the chain.
  assert disk_errors.disk_failure(caught.value, "/w") == str(caught.value)
  # tensorstore's wrapping of the same error (a ValueError) too.
  wrapped = ValueError("Failed writing: \"/w/checkpoints/5/x\": [os_error_code='28']")
  with pytest.raises(errors.DiskFailure, match="no space left on device: /w/checkpoints/5/x"):
    with errors.disk_failures_fail_the_run("/w"):
      raise wrapped


def test_other_errors_in_the_timeline_pass_unchanged():
  for e in (ValueError("train.steps: bad"), FileNotFoundError(errno.ENOENT, "gone", "/x")):
    with pytest.raises(type(e)) as caught:
      with errors.disk_failures_fail_the_run("/w"):
        raise e
    assert caught.value is e


@pytest.mark.parametrize("raised, code, stopped", [
    (OSError(errno.ENOSPC, "No space left on device", "/w/config.json"), 2, False),
    (errors.DiskFailure("no space left on device: /w/metrics.jsonl"), 1, True),
    (ValueError("train.steps: must be >= 1, got 0"), 2, False),
])
def test_train_exit_code_comes_from_the_error_type(raised, code, stopped, tmp_path, monkeypatch,
                                                   capsys):
  """The same full disk is bad setup (2) before training and a failed run (1) inside the
  training timeline, where the loop raises it as a DiskFailure chained from the OSError."""
  from jaxdl.train import loop
  if isinstance(raised, errors.DiskFailure):
    raised.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl")

  def fail(*args, **kwargs):
    raise raised

  monkeypatch.setattr(loop, "run", fail)
  assert cli.main(["train", "moons_mlp", "--workdir", str(tmp_path / "w"), "--no-progress"]) == code
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error: "), err
  # No checkpoint was written here: the line says nothing is kept rather than claim one is.
  assert ("the run stopped before its first checkpoint, so nothing is kept" in err[0]) == (
      stopped), err
  assert "last good checkpoint" not in err[0]


def test_a_full_disk_after_a_checkpoint_names_the_step_it_keeps(tmp_path, monkeypatch, capsys):
  from jaxdl.train import loop
  (tmp_path / "w" / "checkpoints" / "5").mkdir(parents=True)

  def fail(*args, **kwargs):
    raise errors.DiskFailure("no space left on device: /w/metrics.jsonl") from OSError(
        errno.ENOSPC, "No space left on device", "/w/metrics.jsonl")

  monkeypatch.setattr(loop, "run", fail)
  assert cli.main(["train", "moons_mlp", "--workdir", str(tmp_path / "w"), "--no-progress"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "its last good checkpoint (step 5) is kept" in err[0], err


def _raises(e: BaseException):
  def main(args):
    del args
    raise e
  return main


def _interrupted_import():
  """What a signal raised inside an extension module's import looks like to its importer."""
  try:
    try:
      raise stop_signals.Interrupted("SIGINT")
    except stop_signals.Interrupted as e:
      raise ImportError("Encountered an error while initializing the extension") from e
  except ImportError as e:
    return e


@pytest.mark.parametrize("raised, code, line", [
    (ConfigError("train.steps: must be >= 1, got 0\n(more)"), 2,
     "jaxdl: error: train.steps: must be >= 1, got 0"),
    (ValueError("--out x: folder is not writable"), 2, "jaxdl: error: --out x: folder is not "
                                                        "writable"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), 2,
     "jaxdl: error: [Errno 2] No such file or directory: '/x'"),
    (errors.NonFiniteLossError(3, {"loss": float("nan")}), 1,
     "jaxdl: loss became non-finite at step 3 (loss nan); stopped without saving that state"),
    (errors.RunError("sweep: 1 of 2 runs failed: a"), 1, "jaxdl: sweep: 1 of 2 runs failed: a"),
    (stop_signals.Stopped("SIGTERM", "stopped by SIGTERM at step 4; its checkpoint is saved"), 0,
     "jaxdl: stopped by SIGTERM at step 4; its checkpoint is saved"),
    (stop_signals.Interrupted("SIGINT"), 130, "jaxdl: stopped by SIGINT"),
    (_interrupted_import(), 130, "jaxdl: stopped by SIGINT"),
    (KeyboardInterrupt(), 130, "jaxdl: stopped by SIGINT"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/out"), 2,
     "jaxdl: error: read-only file system: /ro/out"),
], ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else None)
def test_the_handler_turns_the_type_raised_into_one_line_and_the_exit_code(raised, code, line,
                                                                          monkeypatch, capsys):
  """Every command ends through `jaxdl.cli.main`'s handler: bad input 2, a failed run 1, a stop
  0 (SIGTERM) or 130 (SIGINT), each one line on stderr (a call from Python: no os._exit)."""
  monkeypatch.setattr(listing, "main", _raises(raised))
  assert cli.main(["list"]) == code
  assert capsys.readouterr().err.splitlines() == [line]


def test_a_bug_keeps_its_traceback(monkeypatch):
  monkeypatch.setattr(listing, "main", _raises(ZeroDivisionError("a bug")))
  with pytest.raises(ZeroDivisionError):
    cli.main(["list"])


def test_a_nonfinite_loss_prints_the_locator_below_its_line(monkeypatch, capsys):
  e = errors.NonFiniteLossError(3, {"loss": float("inf")})
  e.add_note("first non-finite module: Dense_1")
  monkeypatch.setattr(listing, "main", _raises(e))
  assert cli.main(["list"]) == 1
  assert capsys.readouterr().err.splitlines()[1:] == ["first non-finite module: Dense_1"]


def test_no_command_module_returns_an_exit_code_or_prints_an_error_line():
  """Exit codes and `jaxdl: error` lines come from the handler alone (`jaxdl.cli.main`); a
  command returns on success and raises otherwise. (distributed.py's watchdog thread, which
  cannot raise into the main thread, ends the program itself.)"""
  found = []
  for path in sorted((ROOT / "cli").glob("*.py")):
    if path.name == "__init__.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Return) and isinstance(node.value, ast.Constant)
          and type(node.value.value) is int):  # not `return True`
        found.append(f"{path.name}:{node.lineno}: return {node.value.value}")
      if (isinstance(node, ast.Constant) and isinstance(node.value, str)
          and "jaxdl: error" in node.value and path.name != "distributed.py"):
        found.append(f"{path.name}:{node.lineno}: prints {node.value!r}")
  assert not found, found
