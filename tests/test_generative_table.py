"""jaxdl.course.generative_table: the table's rows as markdown."""

from jaxdl.course import generative_table


def test_markdown_writes_one_line_per_row_with_its_failure_column():
  rows = {
      "toy_gan": {"data": "toy", "family": "GAN", "calls": 1, "seconds_per_sample": 3e-7,
                  "time_ratio": 1.0, "quality": {"energy_ratio": 2.68}, "modes_covered": 8},
      "digits_vae": {"data": "digits", "family": "VAE", "calls": 1, "seconds_per_sample": 1e-6,
                     "time_ratio": 1.0, "bits_per_dim": 0.222, "bits_per_dim_kind": "bound",
                     "bits_per_dim_dequantized": 0.256, "active_units": 2.0,
                     "quality": {"confident": 0.9, "frechet": 31.1, "frechet_floor": 5.8}},
  }
  lines = generative_table.markdown(rows).splitlines()
  assert len(lines) == 4 and lines[0].startswith("| data | family | calls |")
  assert lines[2] == ("| toy | GAN | 1 | 0.000 (1.0x) | none | ED 2.68x floor | modes covered "
                      "8/8 (8 Gaussians) |")
  assert lines[3] == ("| digits | VAE | 1 | 0.001 (1.0x) | 0.222 bound [0.256] | 90% >= 0.9; "
                      "FD 31.1 (floor 5.8) | active units 2 |")
