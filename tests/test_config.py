"""Config loading, overrides and validation; CLI bad-input behaviour."""

import pytest

from jaxdl import cli
from jaxdl.config import ConfigError, apply_overrides, diff_configs, load_config


def test_overrides_apply_with_types():
  config, _ = load_config("moons_mlp", ["optim.lr=3e-3", "train.steps=500",
                                        "model.hidden=(32, 32)", "config.seed=7"])
  assert config.optim.lr == pytest.approx(3e-3)
  assert config.train.steps == 500 and isinstance(config.train.steps, int)
  assert tuple(config.model.hidden) == (32, 32)
  assert config.seed == 7


def test_int_accepted_for_float_and_arg_selects_variant():
  config, _ = load_config("experiments/moons_mlp.py:bn", ["optim.lr=1"])
  assert config.model.norm == "batch"
  assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)


@pytest.mark.parametrize("override, key", [
    ("optim.lrr=3", "optim.lrr: unknown key"),
    ("nosection.x=1", "nosection: unknown key"),
    ("optim.lr=abc", "optim.lr: expected float"),
    ("train.steps=1.5", "train.steps: expected int"),
    ("train.steps=-5", "train.steps: must be > 0, got -5"),
    ("train.precision='fp8'", "train.precision: expected one of"),
    ("parallel.strategy='tpu'", "parallel.strategy"),
    ("optim", "override: 'optim' is not of the form"),
])
def test_bad_overrides_name_the_key(override, key):
  with pytest.raises(ConfigError, match=key.replace("(", r"\(")):
    load_config("moons_mlp", [override])


def test_unknown_experiment_lists_known_ones():
  with pytest.raises(ConfigError, match="moons_mlp"):
    load_config("no_such_experiment")


def test_locked_config_rejects_new_keys():
  config, _ = load_config("moons_mlp")
  with pytest.raises(ConfigError):
    apply_overrides(config, ["train.brand_new=1"])


def test_diff_configs_names_dotted_keys():
  assert diff_configs({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}) == ["a.c: 2 -> 3"]


@pytest.mark.parametrize("argv", [
    ["train", "moons_mlp", "--set", "optim.lrr=3"],
    ["train", "moons_mlp", "--config.train.steps=-1"],
    ["train", "nope"],
    ["train", "moons_mlp", "--set", "data.batch_size=1001"],  # larger than the training set
])
def test_cli_bad_input_exits_2_and_writes_nothing(argv, tmp_path, capsys):
  workdir = tmp_path / "run"
  assert cli.main([*argv, "--workdir", str(workdir)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error:")
  assert not workdir.exists()


def test_cli_list_shows_descriptions(capsys):
  assert cli.main(["list"]) == 0
  out = capsys.readouterr().out
  assert "moons_mlp" in out and "BatchNorm" in out


def test_experiment_args_compose():
  from jaxdl.config import parse_arg
  args = parse_arg("bn,smoke,steps=50", bn=False, smoke=False, plain=False, steps=10)
  assert (args.bn, args.smoke, args.plain, args.steps) == (True, True, False, 50)
  assert parse_arg(None, smoke=False).smoke is False
  with pytest.raises(ValueError, match="unknown arg 'bm'; expected some of bn, smoke"):
    parse_arg("bm", bn=False, smoke=False)
  with pytest.raises(ValueError, match="arg steps: expected int, got 'x'"):
    parse_arg("steps=x", steps=10)
  config, _ = load_config("moons_mlp:bn,smoke")
  assert config.model.norm == "batch" and config.train.steps == 20
  with pytest.raises(ConfigError, match="moons_mlp rejects arg 'bn,bm'"):
    load_config("moons_mlp:bn,bm")


def test_train_and_parallel_sections_check_their_values():
  for override, message in [("train.label_smoothing=1.5", "train.label_smoothing: must be in"),
                            ("train.spike_watch='lss'", "train.spike_watch: expected one of"),
                            ("parallel.fsdp=-1", "parallel.fsdp: must be >= 0")]:
    with pytest.raises(ConfigError, match=message):
      load_config("moons_mlp", [override])


def test_smoke_sets_the_flag_and_the_short_run():
  """`jaxdl.config.smoke`: the one smoke shrink; procedures read `config.smoke`, never steps."""
  from jaxdl.config import base_config, smoke
  c = smoke(base_config(), steps=6, eval_every=3, ckpt_every=2)
  assert c.smoke and (c.train.steps, c.train.eval_every, c.train.ckpt_every) == (6, 3, 2)
  assert load_config("karate_gnn:smoke")[0].smoke and not load_config("karate_gnn")[0].smoke


@pytest.mark.parametrize("value, message", [
    ("True", "train.steps: expected int, got True"),
    ("1e26", "train.steps: expected int, got '1e26'"),
    ("9223372036854775808", "train.steps: 9223372036854775808 does not fit in a 64-bit integer"),
])
def test_a_bool_or_an_integer_beyond_int64_is_not_a_step_count(value, message):
  with pytest.raises(ConfigError) as e:
    load_config("moons_mlp", [f"train.steps={value}"])
  assert str(e.value) == message


def test_library_procedures_load_no_experiment_by_name():
  """Procedures take configs; the CLI, the experiment files and `jaxdl.config` load by name (the
  sweep applies each point's overrides to the config the CLI loaded, `with_overrides`)."""
  import pathlib
  root = pathlib.Path(__file__).resolve().parent.parent / "jaxdl"
  elsewhere = ("cli", "config/")
  offenders = [f"{p.relative_to(root)}:{i}"
               for p in sorted(root.rglob("*.py"))
               if not any(p.relative_to(root).as_posix().startswith(e) for e in elsewhere)
               for i, line in enumerate(p.read_text().splitlines(), 1) if "load_config(" in line]
  assert offenders == []
