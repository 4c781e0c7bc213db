"""tests/warm_python.py: commands forked from a warm interpreter behave as `python -m`/`-c` ones."""

import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest

import warm_python

SHOW = """import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"),
                  "main": __name__}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_command_gets_its_arguments_environment_directory_and_exit_code(tmp_path):
  import json
  args = [sys.executable, "-c", SHOW, "3", "b c"]
  env = {**os.environ, "X": "seen"}
  assert warm_python.warmable(args, env)
  done = warm_python.run(args, env=env, cwd=tmp_path, timeout=60)
  assert done.returncode == 3, done.stderr
  assert json.loads(done.stdout) == {"argv": ["-c", "3", "b c"], "cwd": str(tmp_path),
                                     "x": "seen", "main": "__main__"}
  assert done.stderr == "to stderr\n"
  with pytest.raises(subprocess.CalledProcessError):
    warm_python.run(args, env=env, cwd=tmp_path, timeout=60, check=True)


def test_python_m_jaxdl_runs_the_program():
  done = warm_python.run([sys.executable, "-m", "jaxdl", "list"], timeout=60)
  assert done.returncode == 0, done.stderr
  assert "moons_mlp" in done.stdout


def test_an_uncaught_exception_exits_1_with_its_traceback_after_the_exit_handlers():
  code = ("import atexit, threading, time\n"
          "atexit.register(lambda: print('exit handler'))\n"
          "threading.Thread(target=lambda: (time.sleep(0.3), print('thread joined'))).start()\n"
          "raise ValueError('boom')\n")
  done = warm_python.run([sys.executable, "-c", code], timeout=60)
  assert done.returncode == 1
  assert "ValueError: boom" in done.stderr and "Traceback" in done.stderr
  # As the interpreter exits: the non-daemon thread first, then the atexit handlers.
  assert done.stdout == "thread joined\nexit handler\n"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_forked_child_is_a_process_of_its_own(sig):
  proc = warm_python.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  assert isinstance(proc, warm_python.Child) and proc.pid not in (None, os.getpid())
  assert proc.poll() is None
  proc.send_signal(sig)
  assert proc.wait(timeout=30) == -sig


def test_the_emulated_device_count_is_the_childs_own():
  """XLA reads XLA_FLAGS when the child's first backend starts, not when jax is imported."""
  show = "import jax; print(len(jax.devices()))"
  for n in (3, 2):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
    assert warm_python.warmable([sys.executable, "-c", show], env)
    assert warm_python.run([sys.executable, "-c", show], env=env, timeout=60).stdout == f"{n}\n"


def test_an_import_time_setting_of_its_own_gets_a_real_subprocess(monkeypatch):
  show = "import jax.numpy as jnp; print(jnp.zeros(1).dtype)"
  args = [sys.executable, "-c", show]
  env = {**os.environ, "JAX_ENABLE_X64": "1"}  # read when jax is imported
  assert not warm_python.warmable(args, env)
  assert warm_python.run(args, env=env, timeout=60).stdout == "float64\n"
  assert not warm_python.warmable(["python3", "-c", show])
  assert warm_python.warmable(args)
  monkeypatch.setenv(warm_python.FRESH, "1")  # the whole suite's switch
  assert not warm_python.warmable(args)


def test_the_childrens_cpu_seconds_are_counted():
  """A child belongs to the server, so the CPU log counts it through `cpu_seconds`."""
  burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
  before = warm_python.cpu_seconds()
  assert warm_python.run([sys.executable, "-c", burn], timeout=60).returncode == 0
  assert warm_python.cpu_seconds() - before >= 0.5


def _cpu_log_seconds() -> float:
  """What tests/conftest.py's CPU log reads."""
  s, c = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + warm_python.cpu_seconds()


def test_a_command_whose_server_died_is_an_error_not_a_hang():
  proc = warm_python.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  before = _cpu_log_seconds()
  server, _ = warm_python._server[0]  # pylint: disable=protected-access
  server.proc.kill()
  with pytest.raises(RuntimeError, match="server exited before this command did"):
    proc.wait(timeout=30)
  os.kill(proc.pid, signal.SIGKILL)  # the orphan, now init's
  shutil.rmtree(server.folder)  # what the server would have removed on its way out
  # The next command starts a new server.
  assert warm_python.run([sys.executable, "-c", "print(1)"], timeout=60).stdout == "1\n"
  # Reaping the old server adds its CPU (its imports, every command it ran) where the log
  # reads it, once more: taken back out, the test costs about the new server's imports. Counted
  # twice, this test cost 142 CPU-s in a whole run's log.
  new, _ = warm_python._server[0]  # pylint: disable=protected-access
  assert new is not server
  assert _cpu_log_seconds() - before < new.start_cpu + 1.5
