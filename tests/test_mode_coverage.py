"""jaxdl.generative.mode_coverage: the 8-Gaussian modes counted on known samples."""

import numpy as np

from jaxdl.data import sample_toy2d
from jaxdl.generative import mode_coverage


def test_fresh_target_points_cover_every_mode_and_one_centre_covers_one():
  centres, mean_dist = mode_coverage.mode_centres()
  assert centres.shape == (8, 2) and 0 < mean_dist < 0.5
  # The centres sit on a circle: every one at the same distance from the origin.
  radii = np.linalg.norm(centres, axis=1)
  np.testing.assert_allclose(radii, radii.mean(), rtol=0.05)
  fresh = mode_coverage.modes_of_8gaussians(sample_toy2d("8gaussians", 2000, 7))
  assert fresh["covered"] == 8 and fresh["near_fraction"] > 0.95
  collapsed = mode_coverage.modes_of_8gaussians(np.repeat(centres[:1], 100, axis=0))
  assert collapsed["covered"] == 1 and collapsed["counts"][0] == 100
