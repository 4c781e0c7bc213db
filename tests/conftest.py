"""Test setup: four emulated CPU devices, set before jax is imported anywhere."""

import os

# The suite is dominated by XLA compiling tiny programs on CPU; the cheaper backend passes halve
# that and change no test's tolerance (speed is measured in `jaxdl bench`, never here).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=4 " + FAST_COMPILE).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keep subprocesses and worker threads from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
