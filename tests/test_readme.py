"""The README's shell commands run top to bottom in a fresh directory, each exiting 0.

The commands are parsed from README.md's ```bash blocks (so the test follows the README), split
on `&&`, `#` comments dropped, and run in order through the in-process `jaxdl.cli.main`, in a
temporary directory where `experiments/` links to the repository's. How they are shrunk:

- `jaxdl train [EXP[:ARG]] ...` runs `EXP:ARG,smoke` (the experiment's own smoke size) with
  `--no-progress --set train.plot=False`, and every `train.steps=N` override becomes
  `min(N, SMOKE_STEPS)`; `--force` and `--profile` are kept. Its workdir is the one the
  README's command uses (its `--workdir`, else the default of the unshrunk experiment,
  `jaxdl.config.default_workdir`), passed explicitly, so two README commands collide here
  exactly when they would as written.
- Other `jaxdl` commands (`jaxdl list`) run as written.
- Skipped, with the reason in SKIPPED: `pip install` (this environment is the installed
  package), `python -m pytest` (the suite itself) and multi-host runs (`--distributed`: one
  machine, no second process).
"""

import json
import os
import pathlib
import re
import shlex

import pytest

from jaxdl import cli
from jaxdl.config import default_workdir, load_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMOKE_STEPS = 20
SKIPPED = {
    "pip install": "this environment is the installed package",
    "python -m pytest": "the test suite itself",
    "--distributed": "a multi-host run needs processes on other hosts",
}


def readme_commands() -> list[str]:
  """Every command of README.md's bash code blocks, in order (`&&` chains split)."""
  text = (ROOT / "README.md").read_text()
  out = []
  for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
    for line in block.splitlines():
      line = line.split(" #", 1)[0].strip()
      out += [part.strip() for part in line.split("&&") if part.strip()]
  return out


def skip_reason(command: str) -> str | None:
  return next((why for key, why in SKIPPED.items() if key in command), None)


def shrink_train(argv: list[str]) -> tuple[list[str], str]:
  """`jaxdl train ...` argv -> (smoke-sized argv with an explicit workdir, that workdir)."""
  args = cli.build_parser().parse_args(cli.split_config_flags(argv))
  spec = args.experiment
  overrides = [re.sub(r"^train\.steps=(\d+)$",
                      lambda m: f"train.steps={min(int(m.group(1)), SMOKE_STEPS)}", o)
               for o in args.overrides]
  workdir = args.workdir or default_workdir(spec, load_config(spec)[0])
  base, _, arg = spec.partition(":")
  flags = [a for a in arg.split(",") if a]
  smoke = f"{base}:{','.join(flags + ([] if 'smoke' in flags else ['smoke']))}"
  out = ["train", smoke, "--workdir", workdir, "--no-progress", "--set", "train.plot=False"]
  for o in overrides:
    out += ["--set", o]
  return out + (["--force"] if args.force else []) + (["--profile"] if args.profile else []), \
      workdir


def run_cli(argv: list[str]) -> int:
  """`jaxdl.cli.main(argv)` in this process; its log handler writes to whatever stderr is now."""
  return cli.main(argv)


def test_readme_commands_parse():
  """The README still has the sequence this test is about (parsing did not silently vanish)."""
  commands = readme_commands()
  assert "jaxdl train" in commands and "jaxdl list" in commands
  assert sum(c.startswith("jaxdl train moons_mlp") for c in commands) >= 4


@pytest.mark.slow
def test_readme_commands_run_in_order(tmp_path, monkeypatch, capsys):
  (tmp_path / "experiments").symlink_to(ROOT / "experiments")
  monkeypatch.chdir(tmp_path)
  ran, skipped = [], []
  for command in readme_commands():
    why = skip_reason(command)
    if why or not command.startswith("jaxdl"):
      skipped.append((command, why or "not a jaxdl command"))
      continue
    argv = shlex.split(command)[1:]
    workdir = None
    if not argv or argv[0] == "train" or argv[0].startswith("-") or (
        argv[0] not in cli.COMMANDS):
      argv, workdir = shrink_train(argv if argv and argv[0] == "train" else ["train", *argv])
    rc = run_cli(argv)
    captured = capsys.readouterr()
    assert rc == 0, f"{command!r} (run as {argv}) exited {rc}:\n{captured.err[-2000:]}"
    if workdir is not None:
      assert os.path.isfile(os.path.join(workdir, "config.json")), command
    ran.append(command)
  assert len(ran) >= 7, (ran, skipped)
  # Item 7 of issue 13: the README's variants train into separate default workdirs.
  assert {"char_gpt", "moons_mlp", "moons_mlp-bn", "moons_mlp-smoke"} <= {
      p.name for p in (tmp_path / "runs").iterdir()}
  # The default experiment (`jaxdl train`) trained, evaluated and stored its summary.
  default_run = tmp_path / "runs" / cli.train.DEFAULT_EXPERIMENT
  default = json.loads((default_run / "summary.json").read_text())
  assert default["step"] > 0 and default["eval"]
  assert (default_run / "metrics.jsonl").exists()
