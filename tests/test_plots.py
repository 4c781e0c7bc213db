"""`jaxdl plot` and loss.png's panels, on metrics.jsonl files written here (no training)."""

from jaxdl import cli
from jaxdl.train import plots
from jaxdl.train.writers import MetricsWriter


def _run(workdir, rates):
  workdir.mkdir()
  writer = MetricsWriter(workdir, tensorboard=False)
  for i, rate in enumerate(rates):
    step = 10 * (i + 1)
    writer.write(step, "train", {"loss": 3.0 / step, "lr": 0.1, "grad_norm": 1.0})
    writer.write(step, "throughput", {"steps_per_s": rate, "examples_per_s": 8 * rate})
  writer.write(30, "eval", {"loss": 0.2})
  writer.close()


def test_training_seconds_panels_and_the_plot_command(tmp_path, capsys):
  a, b = tmp_path / "a", tmp_path / "b"
  _run(a, [5.0, 10.0, 2.0])
  _run(b, [1.0, 1.0, 1.0])
  # Step 10 has no earlier record to time from; then 10 steps at 10/s, 10 more at 2/s.
  assert plots.training_seconds(a) == ([20, 30], [1.0, 6.0])
  assert plots.plot_run(a, title="a").stat().st_size > 10_000
  assert cli.main(["plot", str(a), str(b), "--out", str(tmp_path / "both.png")]) == 0
  assert (tmp_path / "both.png").stat().st_size > 10_000
  capsys.readouterr()
  assert cli.main(["plot", str(a), str(tmp_path / "nothing")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "nothing: no train records" in err[0]
