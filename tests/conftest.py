"""Test setup: four emulated CPU devices, set before jax is imported anywhere."""

import gc
import hashlib
import os
import sys
import tempfile

import pytest

# The suite is dominated by XLA compiling tiny programs on CPU; the cheaper backend passes halve
# that, and XLA:CPU's older elemental fusion emitters compile about 3x faster than the MLIR fusion
# emitters (digits_cnn's train step: 2.5 -> 0.7 CPU-s). One LLVM module per program instead of
# several compiled side by side (a worker has one core to compile them on): the train steps of
# digits_cnn, char_gpt, edm_digits' U-Net and digits_mlp compiled in 3.1-3.6 CPU-s against
# 3.7-4.1, and five test modules took 144 CPU-s against 173. None changes any test's tolerance
# (speed is measured in `jaxdl bench`, never here).
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Under `-n W` each xdist worker (and every process it starts) gets its own W-th of the cores,
# before jax is imported, so XLA sizes its thread pools to them. Left to share all cores, two
# workers' XLA thread pools each wait on threads the other worker's compute has taken: a subset
# of 56 tests took 95-98 s and 150-159 CPU-s that way, and 77-82 s and 124-144 CPU-s pinned.
if os.environ.get("PYTEST_XDIST_WORKER") and hasattr(os, "sched_setaffinity"):
  _cpus = sorted(os.sched_getaffinity(0))
  _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
  _mine = _cpus[int(os.environ["PYTEST_XDIST_WORKER"][2:]) % _workers::_workers]
  if _workers > 1 and _mine:
    os.sched_setaffinity(0, _mine)
# The CPU-only flags are left out when scripts/gpu_check.sh runs the suite's GPU-sensitive tests
# on a GPU (JAX_PLATFORMS=cuda).
if os.environ["JAX_PLATFORMS"] == "cpu":
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4 " + FAST_COMPILE).strip()
else:
  # The tests check equations to ~1e-5; a GPU's default fp32 matmul (TF32, 10-bit mantissa) is a
  # training-speed choice that moves them by ~1e-4 (measured on an H200), so tests ask for fp32.
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# XLA's persistent compilation cache, shared by the xdist workers and every subprocess a test
# starts (the CLI, notebook kernels, multi-process runs): the suite compiles the same small
# programs many times over (a SIGKILLed run and its resume compile what the uninterrupted run
# did). A hit loads the executable XLA built before, so results are unchanged (bit-exact resume
# tests pass across it). One directory per checkout and user, kept between runs; its keys hold
# the jax version, the flags and the program, so a stale entry is never used.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"jaxdl-tests-xla-cache-{os.getuid()}-"
    f"{hashlib.sha1(os.path.dirname(os.path.abspath(__file__)).encode()).hexdigest()[:8]}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Keep subprocesses and worker threads from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


# JAXDL_TEST_CPU_LOG=FILE appends each test's CPU seconds (this process and the subprocesses it
# waited for) to FILE: a cost that holds on a loaded machine, where wall-clock durations do not.
# The third column is the test's wall seconds: a test whose wall far exceeds its CPU waits on
# something the log does not count (a SLURM job, a sleep, a timeout). The last three are the
# seconds this process spent tracing, lowering to MLIR and compiling with XLA (JAX's own
# `jax.monitoring` durations; a test's subprocesses are not in them), so a test's cost splits
# into building programs and running them.
PHASES = {"/jax/core/compile/jaxpr_trace_duration": 0,
          "/jax/core/compile/jaxpr_to_mlir_module_duration": 1,
          "/jax/core/compile/backend_compile_duration": 2}
if os.environ.get("JAXDL_TEST_CPU_LOG"):
  import resource
  import time

  _phase_seconds = [0.0] * len(PHASES)
  _listening = []

  def _on_duration(event, duration, **kwargs):
    del kwargs
    if event in PHASES:
      _phase_seconds[PHASES[event]] += duration

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    if not _listening:  # jax is imported by now (collection imported the test modules)
      from jax import monitoring  # pylint: disable=g-import-not-at-top
      monitoring.register_event_duration_secs_listener(_on_duration)
      _listening.append(True)

    def cpu():
      s, c = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
      # Commands forked from tests/warm_python.py's server are its children, not this process's.
      warm = sys.modules.get("warm_python")
      return (s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime +
              (warm.cpu_seconds() if warm else 0.0))
    t0, w0, p0 = cpu(), time.perf_counter(), list(_phase_seconds)
    yield
    phases = "\t".join(f"{b - a:.2f}" for a, b in zip(p0, _phase_seconds))
    with open(os.environ["JAXDL_TEST_CPU_LOG"], "a") as f:
      f.write(f"{cpu() - t0:.2f}\t{item.nodeid}\t{time.perf_counter() - w0:.2f}\t{phases}\n")



# One device unless a module is about devices. The session emulates four CPU devices so that the
# parallelism tests (ALL_DEVICES) have them, but a run whose config says parallel.devices=0 ("all
# of them") would otherwise shard every smoke run over four devices on two cores:
# test_experiment_smoke and test_denoiser took 107 CPU-s that way and 87 on one. So every other
# module's in-process runs train on the first device (parallel.devices=0 reads as 1), and the
# processes its tests start see one device. Module scope, so that a module fixture's run and its
# tests' runs agree. One device of a four-device client does not sum in the order of a
# one-device client (a moons run's grad_norm differs in the 7th digit), so a module that compares
# its own runs with a subprocess's (test_sweep_kills) is in ALL_DEVICES.
ALL_DEVICES = frozenset((
    "test_augment", "test_bench", "test_config", "test_distributed",
    "test_faults", "test_fsdp", "test_grad_accum", "test_layers", "test_loop", "test_mfu",
    "test_moe", "test_packing", "test_parallel", "test_permissions", "test_resume",
    "test_sequence_parallel", "test_signals", "test_slurm", "test_small_rows", "test_step",
    "test_studies", "test_sweep", "test_sweep_kills", "test_tensor_parallel", "test_throughput",
    "test_trackers_real", "test_tree_reductions", "test_watch"))


@pytest.fixture(autouse=True, scope="module")
def _one_device_unless_about_devices(request):
  if request.path.stem in ALL_DEVICES or os.environ["JAX_PLATFORMS"] != "cpu":
    yield
    return
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdl.train import strategies  # pylint: disable=g-import-not-at-top
  # This worker's own backend starts now, with the session's four devices: XLA reads XLA_FLAGS
  # once, when the first computation needs a backend, and the one-device flags below are for the
  # processes this module starts.
  jax.devices()
  make_strategy = strategies.make_strategy

  def one_device(name, num_devices=0, *args, **kwargs):
    return make_strategy(name, num_devices or 1, *args, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(strategies, "make_strategy", one_device)
    patch.setenv("XLA_FLAGS", os.environ["XLA_FLAGS"].replace(
        "--xla_force_host_platform_device_count=4", "--xla_force_host_platform_device_count=1"))
    yield


# Tests that compute more than they compile (`@pytest.mark.compute_bound`: a 1000-step sampler
# over 20,000 samples, a vmapped multi-seed training run) compile at XLA's own optimization level
# rather than FAST_COMPILE's: the DDIM-vs-DDPM statistics test took 12.2 CPU-s with the flags and
# 4.0 without. XLA_FLAGS are read once per process, so the flags are undone per compile, through
# the per-compile option overrides that `jax.jit(..., compiler_options=...)` also uses. That hook
# is private to jax (`jax._src.compiler.get_compile_options`); where it is gone, the marked tests
# run with the fast flags, only slower, and tests/test_harness.py fails to say so. The persistent
# compilation cache keys on these options, so its entries of the two kinds never mix.
OPTIMIZED = {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False}


@pytest.fixture(autouse=True)
def _compute_bound_tests_compile_optimized(request):
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  get_compile_options = getattr(compiler, "get_compile_options", None)
  if (request.node.get_closest_marker("compute_bound") is None or get_compile_options is None or
      os.environ["JAX_PLATFORMS"] != "cpu"):
    yield
    return

  def optimized(*args, env_options_overrides=None, **kwargs):
    return get_compile_options(*args, env_options_overrides={**(env_options_overrides or {}),
                                                             **OPTIMIZED}, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(compiler, "get_compile_options", optimized)
    yield


# Scheduling under `-n 2`. Whole modules go to one worker (xdist's load-by-scope scheduler), so a
# module-scoped fixture (a trained run that several tests read) is built once, not once per
# worker; and the costliest modules are collected first, so the two workers start on them and
# finish on the many cheap ones together instead of one waiting out a long module at the end.
# The order is from JAXDL_TEST_CPU_LOG (CPU seconds per module, summed; CONTRIBUTING.md).
COSTLIEST_FIRST = (
    "test_readme", "test_resume", "test_notebooks", "test_reproduce", "test_generative_table",
    "test_sweep_search", "test_slurm", "test_denoiser", "test_few_step_digits",
    "test_experiment_smoke", "test_doctor", "test_packed_documents", "test_faults",
    "test_distributed", "test_tensor_parallel", "test_moe", "test_sweep_kills", "test_sweep",
    "test_digits_judge",
    "test_few_step", "test_autoregressive_digits")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
  # A stable sort keeps each module's tests together and in their own order.
  items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's, absent under `-p no:xdist`
def pytest_xdist_make_scheduler(config, log):
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top
  # xdist would hand out the modules with the most tests first; keep COSTLIEST_FIRST's order
  # (test_readme, one 130 CPU-s test, ran last that way and ended the run alone for a minute).
  config.option.loadscopereorder = False
  return LoadScopeScheduling(config, log)


def pytest_collection_finish(session):
  """Freezes what collection imported (jax, flax, the library, the test modules), as a `jaxdl`
  process does after its imports (`jaxdl.cli.load_library_frozen`): full garbage collections
  during the tests' tracing then walk only the tests' own objects. Three modules in one process,
  two alternations: 61.2 and 64.7 s against 59.5 and 60.7 s (about 4%). Then the collector
  runs less often (`warm_python.GC_THRESHOLDS`)."""
  del session
  gc.freeze()
  import warm_python  # pylint: disable=g-import-not-at-top
  gc.set_threshold(*warm_python.GC_THRESHOLDS)  # why: the comment above GC_THRESHOLDS


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  """An xdist worker leaves at once, its results sent. Otherwise it waits for the main process to
  close its channel, which happens when the last worker is done, and only then runs pytest's
  final garbage collections and jax's exit handler (which clears every cache of compiled
  programs): 5-9 s of wall at the end of every whole run, after all the tests, measured with
  faulthandler stack dumps at the workers' exit. Nothing is left to write: each test's report
  (and its JAXDL_TEST_CPU_LOG line) went out when it finished, and the main process takes the
  outcome from those reports, not from a worker's exit status (a failing run still exits 1)."""
  del config
  if os.environ.get("PYTEST_XDIST_WORKER"):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # pylint: disable=protected-access


@pytest.fixture(scope="session")
def untrained_run():
  """`make(workdir, experiment, *example_inputs) -> workdir`: a checkpoint of the experiment's
  model at random parameters (N(0, 0.1^2), drawn on the host from seed 0: nothing compiled),
  written by `evaluation.save_run`. For tests of what reads a run (sampling, generation)."""
  def make(workdir, experiment, *example_inputs):
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jaxdl.config import load_config  # pylint: disable=g-import-not-at-top
    from jaxdl.generative import evaluation  # pylint: disable=g-import-not-at-top
    from jaxdl.models import build_model  # pylint: disable=g-import-not-at-top
    config, _ = load_config(experiment)
    model = build_model(config.model)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *example_inputs,
                                               train=False))["params"]
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (0.1 * rng.normal(size=s.shape)).astype(np.float32), shapes)
    return evaluation.save_run(workdir, config, params, step=0)
  return make


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory):
  """hf_model(name, **kw) -> the directory of a tiny random Hugging Face model of family `name`
  that transformers saved (tests/hf_reference.py's `saved`), once per worker, name and settings."""
  root = str(tmp_path_factory.mktemp("hf"))

  def make(name: str, **kw) -> str:
    import hf_reference  # torch and transformers load only in the tests that ask
    return hf_reference.saved(name, root, **kw)

  return make
