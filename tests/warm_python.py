"""`python -m MODULE ...` and `python -c CODE ...` processes forked from a warm interpreter.

A test that runs the `jaxdl` program in a process of its own (a SIGKILLed run, the resume after
it, a run on a full disk) spent about half of that process importing jax, flax, optax, orbax and
grain: 2.5 of its 5 CPU-s. Here one server process per test process imports the library once, as
the `jaxdl` program does (`jaxdl.cli.load_library_frozen`), and forks a child per command. The
child takes the command's environment, working directory and output files, runs the command as
the interpreter would (`runpy` for -m, `exec` in a fresh `__main__` for -c; SystemExit's code,
then the threads joined and the atexit handlers run) and exits: a real process, with its own pid,
exit status and signals (a SIGKILLed child's return code is -9).

A fork cannot give a child what an interpreter reads while it imports: jax reads its JAX_*
settings then, the interpreter its PYTHON* ones, jaxlib TF_* when it loads. A command whose
environment differs from the server's in any of those runs as a real subprocess instead, as
every command does with JAXDL_TEST_FRESH_PROCESSES=1 set. XLA reads XLA_FLAGS when the first
backend starts, which happens in the child, so those may differ (the emulated device count
does). Tests about the interpreter's own start (a signal while jax imports, the console entry
point, what `jaxdl list` imports) start their processes with `subprocess` directly.

One difference from a fresh interpreter is on purpose: the server and its children collect
garbage at the suite's `GC_THRESHOLDS`, not Python's (what a command computes is unchanged).

A child is the server's child, not the test's, so the test's `RUSAGE_CHILDREN` does not see
it: the server reports each child's CPU seconds (from `wait4`) and its own start-up's, and
`cpu_seconds()` sums them for tests/conftest.py's CPU log.
"""

import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

# Environment variables read while the interpreter starts or jax and jaxlib import.
IMPORT_TIME = ("JAX_", "PYTHON", "TF_")
FRESH = "JAXDL_TEST_FRESH_PROCESSES"
# The cyclic garbage collector's thresholds in the suite's processes (the xdist workers, this
# server and its children, the notebook kernels): a young collection every 10,000 net
# allocations instead of Python's 700. Tracing a model allocates millions of short-lived objects,
# and at the default a worker ran 1,340 collections (11 full ones) over tests/test_gpt.py and
# test_packed_documents.py, 1.5 CPU-s of the modules' 47.5-49.7; at these, 66 (none full),
# 0.36 CPU-s, and the modules took 43.6-46.9 (one pinned process, a fresh compilation cache
# each, alternated). What the tests compute is unchanged; only when garbage is freed.
GC_THRESHOLDS = (10_000, 20, 20)

_cpu = [0.0]  # seconds of exited children and of the server's start-up, this process's servers
_server = []  # [(_Server, pid of the process that started it)]
_lock = threading.Lock()


def cpu_seconds() -> float:
  """CPU seconds of every child that has exited and of the servers' start-ups so far."""
  return _cpu[0]


def _children_cpu() -> float:
  import resource  # pylint: disable=g-import-not-at-top
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def warmable(args, env=None) -> bool:
  """Whether `args` (with environment `env`, default this process's) can run as a forked child:
  `sys.executable -m MODULE ...` or `sys.executable -c CODE ...`, with the server's
  import-time environment."""
  if os.environ.get(FRESH) or not hasattr(os, "fork") or sys.platform != "linux":
    return False
  args = [str(a) for a in args]
  if len(args) < 3 or args[0] != sys.executable or args[1] not in ("-m", "-c"):
    return False
  env = os.environ if env is None else env
  base = _server[0][0].env if _server and _server[0][1] == os.getpid() else os.environ
  keys = {k for k in (*env, *base) if k.startswith(IMPORT_TIME)}
  return all(env.get(k) == base.get(k) for k in keys)


def run(args, *, env=None, cwd=None, timeout=None, check=False):
  """`subprocess.run(args, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True,
  check=check)`, forked from the warm interpreter when `warmable`."""
  if not warmable(args, env):
    return subprocess.run(args, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True,
                          check=check)
  proc = Popen(args, env=env, cwd=cwd)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    raise
  done = subprocess.CompletedProcess(args, proc.returncode, out, err)
  if check:
    done.check_returncode()
  return done


def Popen(args, *, env=None, cwd=None):  # pylint: disable=invalid-name
  """`subprocess.Popen(args, env=env, cwd=cwd, stdout=PIPE, stderr=PIPE, text=True)`, forked
  from the warm interpreter when `warmable`: a `Child` then."""
  if not warmable(args, env):
    return subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  with _lock:
    if not _server or _server[0][1] != os.getpid() or _server[0][0].closed:
      if _server and _server[0][1] == os.getpid():
        # Closed: gone or going (its pipes close before it can be reaped). Reaped here, its CPU
        # (its own and its children's) joins this process's RUSAGE_CHILDREN, which the CPU log
        # reads too; `_cpu` has counted it already.
        before = _children_cpu()
        _server[0][0].proc.kill()
        _server[0][0].proc.wait()
        _cpu[0] -= _children_cpu() - before
      _server[:] = [(_Server(), os.getpid())]
    server = _server[0][0]
  return server.start([str(a) for a in args], dict(os.environ if env is None else env),
                      str(cwd or os.getcwd()))


class Child:
  """A forked command, with the part of `subprocess.Popen`'s interface the tests use. Its
  output goes to files, read by `communicate` once it has exited."""

  def __init__(self, args, outputs):
    self.args, self.pid, self.returncode = args, None, None
    self._outputs = outputs
    self._started, self._exited = threading.Event(), threading.Event()

  def poll(self):
    return self.returncode

  def wait(self, timeout=None):
    if not self._exited.wait(timeout):
      raise subprocess.TimeoutExpired(self.args, timeout)
    if self.returncode is None:
      raise RuntimeError(f"the warm_python server exited before this command did: {self.args}")
    return self.returncode

  def send_signal(self, sig):
    self._started.wait()
    if self.returncode is None and self.pid is not None:
      try:
        os.kill(self.pid, sig)
      except ProcessLookupError:  # exited since; its status is on the way
        pass

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout=None):
    self.wait(timeout)
    texts = [pathlib.Path(path).read_text(errors="replace") for path in self._outputs]
    for path in self._outputs:
      os.unlink(path)
    return tuple(texts)


class _Server:
  """The warm interpreter: `python warm_python.py`, JSON lines in (commands) and out (each
  child's pid, then its return code and CPU seconds)."""

  def __init__(self):
    self.env = dict(os.environ)
    # The children's output files; the server removes the folder when it exits.
    self.folder = tempfile.mkdtemp(prefix="warm_python-")
    self.proc = subprocess.Popen([sys.executable, __file__, self.folder], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=self.env)
    self.start_cpu = json.loads(self.proc.stdout.readline())["cpu"]  # its imports
    _cpu[0] += self.start_cpu
    # Set when its replies end: from then on it starts nothing (a killed server's pipes close
    # before the process can be reaped, so `proc.poll()` may still say it runs).
    self.closed = False
    self._children, self._next = {}, 0
    threading.Thread(target=self._replies, daemon=True, name="warm_python").start()

  def start(self, args, env, cwd) -> Child:
    with _lock:
      if self.closed:
        raise RuntimeError(f"the warm_python server has exited; not started: {args}")
      self._next += 1
      outputs = [os.path.join(self.folder, f"{self._next}.{name}") for name in ("out", "err")]
      child = self._children[self._next] = Child(args, outputs)
      request = {"id": self._next, "args": args[1:], "env": env, "cwd": cwd,
                 "stdout": outputs[0], "stderr": outputs[1]}
      self.proc.stdin.write((json.dumps(request) + "\n").encode())
      self.proc.stdin.flush()
    # A fork takes milliseconds; the limit only turns a server that stopped answering into an
    # error rather than a test that never ends.
    if not child._started.wait(timeout=120):  # pylint: disable=protected-access
      raise RuntimeError(f"the warm_python server did not start {args} within 120 s")
    if child.pid is None:
      raise RuntimeError(f"the warm_python server exited before starting {args}")
    return child

  def _replies(self):
    try:
      for line in self.proc.stdout:
        reply = json.loads(line)
        with _lock:
          child = self._children[reply["id"]]
        if "pid" in reply:
          child.pid = reply["pid"]
          child._started.set()  # pylint: disable=protected-access
        else:
          with _lock:
            _cpu[0] += reply["cpu"]
            child.returncode = reply["returncode"]
            del self._children[reply["id"]]
          child._exited.set()  # pylint: disable=protected-access
    finally:
      with _lock:  # the server is gone: nothing more will be reported for its commands
        self.closed = True
        orphans = list(self._children.values())
      for child in orphans:
        child._started.set()  # pylint: disable=protected-access
        child._exited.set()  # pylint: disable=protected-access


# --------------------------------------------------------------------------------------------
# The server process.

def _serve(folder):
  replies = os.dup(1)
  os.dup2(2, 1)  # whatever the library prints goes to stderr, not into the replies

  def send(message):
    os.write(replies, (json.dumps(message) + "\n").encode())

  import resource  # pylint: disable=g-import-not-at-top
  from jaxdl.cli import load_library_frozen  # pylint: disable=g-import-not-at-top
  load_library_frozen()
  import gc  # pylint: disable=g-import-not-at-top
  gc.set_threshold(*GC_THRESHOLDS)  # the children inherit them
  usage = resource.getrusage(resource.RUSAGE_SELF)
  send({"cpu": usage.ru_utime + usage.ru_stime})
  children, pending = {}, b""
  while True:
    # While children run, wake every 20 ms to reap those that exited.
    readable, _, _ = select.select([0], [], [], 0.02 if children else None)
    if readable:
      chunk = os.read(0, 1 << 16)
      if not chunk:  # the test process is gone: so are its commands and their outputs
        for pid in children:
          os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)  # pylint: disable=protected-access
      pending += chunk
      while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
          os.close(replies)
          _child(request)  # does not return
        children[pid] = request["id"]
        send({"id": request["id"], "pid": pid})
    while children:
      pid, status, usage = os.wait4(-1, os.WNOHANG)
      if pid == 0:
        break
      send({"id": children.pop(pid), "returncode": os.waitstatus_to_exitcode(status),
            "cpu": usage.ru_utime + usage.ru_stime})


def _child(request):
  """Runs the command as `python -m ...` or `python -c ...` would, then exits the process."""
  import atexit  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  code = 1
  try:
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # also closes the server's request pipe in the child
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
      out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
      os.dup2(out, fd)
      os.close(out)
    sys.stdout = open(1, "w", closefd=False)  # pylint: disable=consider-using-with
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # pylint: disable=consider-using-with
    flag, target, *rest = request["args"]
    if flag == "-m":
      sys.path[0] = request["cwd"]
      sys.argv = [target, *rest]
      runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
      sys.path[0] = ""
      sys.argv = ["-c", *rest]
      main = types.ModuleType("__main__")
      sys.modules["__main__"] = main
      exec(compile(target, "<string>", "exec"), main.__dict__)  # pylint: disable=exec-used
    code = 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      code = e.code or 0
    else:
      print(e.code, file=sys.stderr)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    try:  # the interpreter's own exit: non-daemon threads joined, then the atexit handlers
      threading._shutdown()  # pylint: disable=protected-access
      atexit._run_exitfuncs()  # pylint: disable=protected-access
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


if __name__ == "__main__":
  _serve(sys.argv[1])
