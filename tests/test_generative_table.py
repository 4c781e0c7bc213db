"""jaxdl.course.generative_table: the whole `generative_table:smoke` run (every family trained
and measured), the table's rows as markdown and the families figure."""

import json
import math

import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.course import generative_table

ROWS = ["toy_fm", "toy_fm_reflow", "toy_fm_distill", "toy_ddpm", "toy_gan", "digits_vae",
        "digits_gan", "digits_fm", "digits_ddpm", "digits_ar"]


@pytest.mark.slow
def test_the_smoke_table_trains_and_measures_every_family(tmp_path):
  """`jaxdl train generative_table:smoke` as a user runs it: the moons flow, then every other
  row's run trained into the workdir (the table's train.plot, train.loggers, train.watch and
  train.count_flops reach them), the digits judged by a digits_cnn run; a row per family with
  its own columns. Smoke-sized runs say nothing of the families' quality, so this checks the
  procedure: the calls, the exact relations between columns, and what each family's failure
  column holds."""
  workdir = tmp_path / "table"
  # No plots, trackers, health signals or FLOP counts: the table reads none of them, and leaving
  # the last two out of every row's train step took the run from 119 to 110 CPU-s.
  shared = ["--set", "train.plot=False", "--set", "train.loggers=()", "--set", "train.watch=off",
            "--set", "train.count_flops=False"]
  assert cli.main(["train", "generative_table:smoke", "--workdir", str(workdir), "--no-progress",
                   *shared]) == 0
  t = load_config("generative_table:smoke")[0].table
  rows = json.loads((workdir / "table.json").read_text())
  assert list(rows) == ROWS
  assert (workdir / "table.md").read_text().count("\n") == 2 + len(ROWS)
  assert all(row["seconds_per_sample"] > 0 for row in rows.values())
  # Every trained row's run (the moons flow is the workdir itself; the few-step students are
  # trained in the table's process) is finished, without the plot and event files the table
  # was told not to write.
  for name in ("toy_ddpm", "toy_gan", "toy_gan_8g", *ROWS[5:]):
    assert (workdir / name / "summary.json").exists(), name
    assert not (workdir / name / "loss.png").exists(), name
    assert not (workdir / name / "tensorboard").exists(), name
    train = json.loads((workdir / name / "config.json").read_text())["train"]
    assert (train["watch"], train["count_flops"]) == ("off", False), name
  # Calls: one for the one-call families and the few-step students, a pass per pixel for the AR,
  # many for the iterative samplers; the time ratio is to the one-call family of the same data.
  assert [rows[k]["calls"] for k in ("toy_fm_reflow", "toy_fm_distill", "toy_gan",
                                     "digits_vae", "digits_gan", "digits_ar")] == [1] * 5 + [64]
  assert min(rows[k]["calls"] for k in ("toy_fm", "toy_ddpm", "digits_fm", "digits_ddpm")) > 1
  assert rows["toy_gan"]["time_ratio"] == rows["digits_vae"]["time_ratio"] == 1.0
  # Bits/dim: none for a GAN; the AR's dequantized figure is its exact one + log2(17/128).
  assert all("bits_per_dim" not in rows[k] for k in ("toy_gan", "digits_gan"))
  assert all(math.isfinite(rows[k]["bits_per_dim"]) for k in ROWS if "gan" not in k)
  ar = rows["digits_ar"]
  assert ar["bits_per_dim_dequantized"] == pytest.approx(
      ar["bits_per_dim"] + math.log2(17 / 128), abs=1e-9)
  # Failure columns, and every digits row judged on the table's sample count.
  assert 0 <= rows["toy_gan"]["modes_covered"] <= 8
  assert 1 <= rows["digits_gan"]["classes_drawn"] <= 10
  assert 0 <= rows["digits_vae"]["active_units"] <= load_config("vae_digits:smoke")[0].model.latent
  for name in ROWS[5:]:
    q = rows[name]["quality"]
    assert q["num"] == t.num and 0 <= q["confident"] <= 1 and q["frechet"] >= 0, name
  samples = dict(np.load(workdir / "samples.npz"))
  assert list(samples) == ROWS
  assert all(samples[k].shape == (t.toy_num, 2) for k in ROWS[:5])
  assert all(samples[k].shape == (t.num, 64) and 0 <= samples[k].min() <= samples[k].max() <= 16
             for k in ROWS[5:])
  _, toy, digits = generative_table.families_figure(samples)
  assert toy == [k[4:] for k in ROWS[:5]] and digits == [k[7:] for k in ROWS[5:]]
  # Train once, read many: the table's ddpm rows are these two experiments' smoke runs, and the
  # suite's only ones (tests/test_experiment_smoke.py leaves them to this test). `jaxdl train`
  # on a finished run trains nothing more and runs the experiment's after_training on it.
  for spec, row in (("ddpm_toy2d:smoke", "toy_ddpm"), ("ddpm_digits_cfg:smoke", "digits_ddpm")):
    before = json.loads((workdir / row / "summary.json").read_text())
    assert cli.main(["train", spec, "--workdir", str(workdir / row), "--no-progress",
                     *shared]) == 0, spec
    assert json.loads((workdir / row / "summary.json").read_text()) == before, spec
    evaluation = json.loads((workdir / row / "generative_eval.json").read_text())
    assert evaluation["step"] == before["step"], spec  # of the row's final checkpoint


def test_a_bad_table_setting_is_refused_before_anything_trains(tmp_path, capsys):
  for bad, why in (("table.timed_calls=0", "table.timed_calls: must be > 0, got 0"),
                   ("table.nums=3", "table.nums: unknown key")):
    workdir = tmp_path / "w"
    assert cli.main(["train", "generative_table:smoke", "--workdir", str(workdir),
                     "--set", bad]) == 2
    assert why in capsys.readouterr().err
    assert not workdir.exists()


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
