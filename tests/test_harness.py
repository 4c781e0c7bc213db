"""The test harness itself (tests/conftest.py): what it promises the other tests."""

import gc
import os
import sys

import pytest
from jax._src import compiler

import conftest
import warm_python


def _overrides() -> dict:
  options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
  return dict(options.env_option_overrides)


@pytest.mark.skipif(os.environ["JAX_PLATFORMS"] != "cpu", reason="the fast-compile flags are CPU's")
@pytest.mark.compute_bound
def test_a_compute_bound_test_compiles_at_xlas_own_optimization_level():
  """Under the marker every compile undoes FAST_COMPILE's two optimization flags. If jax moves
  the hook this relies on, this test fails, where the marked tests would only slow down."""
  assert "--xla_backend_optimization_level=0" in os.environ["XLA_FLAGS"]
  overrides = _overrides()
  for name, value in conftest.OPTIMIZED.items():
    assert overrides[name] == value, (name, overrides)


def test_other_tests_compile_with_the_fast_flags_alone():
  assert not set(conftest.OPTIMIZED) & set(_overrides())


def test_the_worker_and_the_warm_children_collect_garbage_at_the_suites_thresholds():
  assert gc.get_threshold() == warm_python.GC_THRESHOLDS
  show = [sys.executable, "-c", "import gc; print(gc.get_threshold())"]
  if not warm_python.warmable(show):
    pytest.skip(f"commands run as fresh interpreters here ({warm_python.FRESH})")
  child = warm_python.run(show, check=True)
  assert child.stdout.strip() == str(warm_python.GC_THRESHOLDS)
