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


def test_markdown_names_the_classes_a_digits_gan_draws():
  row = {"data": "digits", "family": "GAN", "calls": 1, "seconds_per_sample": 1e-6,
         "time_ratio": 1.0, "classes_drawn": 10,
         "quality": {"confident": 0.87, "frechet": 12.0, "frechet_floor": 5.8}}
  line = generative_table.markdown({"digits_gan": row}).splitlines()[2]
  assert line == ("| digits | GAN | 1 | 0.001 (1.0x) | none | 87% >= 0.9; FD 12.0 (floor 5.8) | "
                  "classes drawn 10/10 |")


def test_families_figure_has_a_square_digit_row_for_every_family_that_makes_digits(tmp_path):
  """Every family of the table draws digits (the GAN too), so the figure has one digits row per
  family, in the table's order, and its 8x8 digits are square on the page."""
  import matplotlib.pyplot as plt
  import numpy as np
  families = {family for _, _, family, _, _ in generative_table.RUNS}
  digit_rows = [(name, family) for name, data, family, _, _ in generative_table.RUNS
                if data == "digits"]
  assert {family for _, family in digit_rows} == families  # GAN included
  rng = np.random.default_rng(0)
  samples = {"toy_fm": rng.normal(size=(50, 2)), "toy_gan": rng.normal(size=(50, 2))}
  samples.update({name: rng.uniform(0, 16, (20, 64)) for name, _ in digit_rows})
  fig, toy, digits = generative_table.families_figure(samples, tmp_path / "families.png")
  assert toy == ["fm", "gan"] and digits == [name[7:] for name, _ in digit_rows]
  assert "gan" in digits and (tmp_path / "families.png").stat().st_size > 0
  ax = fig.axes[-1]
  assert [t.get_text() for t in ax.get_yticklabels()] == digits
  (image,) = ax.get_images()
  rows, cols = image.get_array().shape
  assert (rows, cols) == (9 * len(digits) + 1, 91)  # 8x8 cells, one-pixel gaps
  fig.canvas.draw()
  box = ax.get_window_extent()
  assert abs((box.width / cols) / (box.height / rows) - 1) < 0.02  # square pixels on the page
  plt.close(fig)
