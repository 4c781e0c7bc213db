"""Test setup: four emulated CPU devices, set before jax is imported anywhere."""

import os

# The suite is dominated by XLA compiling tiny programs on CPU; the cheaper backend passes halve
# that and change no test's tolerance (speed is measured in `jaxdl bench`, never here).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CPU-only flags are left out when scripts/gpu_check.sh runs the suite's GPU-sensitive tests
# on a GPU (JAX_PLATFORMS=cuda).
if os.environ["JAX_PLATFORMS"] == "cpu":
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4 " + FAST_COMPILE).strip()
else:
  # The tests check equations to ~1e-5; a GPU's default fp32 matmul (TF32, 10-bit mantissa) is a
  # training-speed choice that moves them by ~1e-4 (measured on an H200), so tests ask for fp32.
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# Keep subprocesses and worker threads from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
