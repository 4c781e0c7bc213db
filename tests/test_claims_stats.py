"""The over-seeds interval of the course's comparison claims (jaxdl/course/claims.py)."""

import math

import numpy as np
import pytest

from jaxdl.course.rows import interval_row, seed_interval

T_975_2 = 4.302652729911275  # t_{0.975, 2}: the 95% two-sided quantile with 2 degrees of freedom


def test_seed_interval_of_1_2_3():
  # mean 2, s = 1, half-width t_{0.975, 2} s / sqrt(3) = 2.484
  mean, lo, hi = seed_interval([1.0, 2.0, 3.0])
  assert mean == pytest.approx(2.0)
  assert (hi - mean) == pytest.approx(T_975_2 / math.sqrt(3)) == pytest.approx(2.484, abs=1e-3)
  assert (mean - lo) == pytest.approx(hi - mean)


def test_seed_interval_needs_two_values():
  with pytest.raises(ValueError, match="needs 2"):
    seed_interval([1.0])


def test_interval_row_passes_only_when_the_interval_clears_the_bound():
  # -0.03 +- 0.01: mean below 0 and the interval too.
  clear = interval_row("x.d", "A - B", [-0.04, -0.03, -0.02], below=0.0)
  assert clear.ok and clear.expected == "95% CI < 0"
  assert clear.measured.startswith("A - B = -0.030 [95% CI ") and "over 3 seeds" in clear.measured
  # The same mean with a spread that covers 0: one seed's sign is not enough.
  assert not interval_row("x.d", "A - B", [-0.13, 0.05, -0.01], below=0.0).ok
  # Two-sided (an equivalence band): inside +-0.01, then not.
  assert interval_row("x.e", "e", [0.001, -0.001, 0.0], above=-0.01, below=0.01).ok
  assert not interval_row("x.e", "e", [0.02, 0.03, 0.025], above=-0.01, below=0.01).ok
  assert not interval_row("x.d", "A - B", [np.nan, -1.0, -1.0], below=0.0).ok
