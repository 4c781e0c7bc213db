"""The multi-run studies (`jaxdl.course.studies`): the main run is measured where it trained and
never trained twice, the other variants train into subdirectories, a diverging variant is
recorded, and variants are the study's config changed by their overrides alone."""

import json

import pytest

from jaxdl.config import ConfigError, load_config
from jaxdl.course import studies
from jaxdl.train import run

TINY = ["train.steps=4", "train.eval_every=2", "train.ckpt_every=4", "train.log_every=1",
        "train.plot=False", "parallel.devices=1"]


def test_depth_sweep_reuses_the_main_run_and_trains_the_others(tmp_path):
  config, module = load_config("gnn_depth:smoke", [*TINY, "depths=(1, 2, 3)"])
  assert config.model.num_layers == 2 and config.smoke
  summary = run(config, str(tmp_path), progress=False)
  results = module.after_training(config, str(tmp_path), summary)
  assert list(results) == ["depth_1", "depth_2", "depth_3"]
  assert not (tmp_path / "depth_2").exists()  # the main run, measured in the workdir itself
  assert (tmp_path / "depth_1" / "config.json").exists()
  assert (tmp_path / "depth_3" / "config.json").exists()
  assert results["depth_2"]["eval_accuracy"] == summary["eval"]["accuracy"]
  for r in results.values():
    assert 0.0 <= r["mad_init"] <= 1.0 and 0.0 <= r["mad_trained"] <= 1.0
  assert json.loads((tmp_path / "results.json").read_text()) == results


def test_a_main_run_outside_the_grid_is_reported_and_a_diverging_variant_recorded(tmp_path):
  config, _ = load_config("bug_lr_too_high:smoke", [*TINY, "optim.lr=1e-3"])
  summary = run(config, str(tmp_path), progress=False)

  def measure(c, directory, s):
    return {"lr": c.optim.lr, "eval_loss": s["eval"]["loss"], "directory": directory}

  results = studies.train_variants(config, str(tmp_path), summary,
                                   {"too_high": {"optim.lr": 1000.0}}, measure, main="healthy",
                                   extra={"study": 1})
  assert list(results) == ["study", "healthy", "too_high"]
  assert results["healthy"] == {"lr": 1e-3, "eval_loss": summary["eval"]["loss"],
                                "directory": str(tmp_path)}
  assert results["too_high"]["diverged"] and "non-finite" in results["too_high"]["error"]


def test_variants_are_checked_like_set_overrides():
  config, _ = load_config("seq2seq_reverse:smoke")
  with pytest.raises(ConfigError, match="^model.atention: unknown key"):
    studies.variant_config(config, {"model.atention": False})
  c = studies.variant_config(config, {"data.length": 16, "model.src_len": 16})
  assert (c.data.length, c.model.src_len, config.data.length) == (16, 16, 4)


def test_layernorm_variants_differ_only_in_layout_and_warmup():
  config, _ = load_config("prepost_ln:smoke")
  cfgs = {name: studies.variant_config(config, o)
          for name, o in studies.layernorm_variants(config.warmup_frac).items()}
  assert list(cfgs) == ["pre_no_warmup", "pre_warmup", "post_no_warmup", "post_warmup"]
  assert cfgs["pre_no_warmup"].to_dict() == config.to_dict()  # the experiment's own run
  assert cfgs["post_no_warmup"].model.to_dict() == {**config.model.to_dict(), "ln": "post"}
  assert cfgs["post_warmup"].optim.schedule.warmup_frac == 0.1
  assert cfgs["pre_warmup"].optim.lr == cfgs["post_no_warmup"].optim.lr == 5e-3  # one peak lr
