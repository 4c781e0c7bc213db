"""A fine-tune's first state never holds a random copy of its base (issue 50,
`jaxdl.train.init_from.init_state`), and an architecture key beside `init_from` is refused
wherever a config becomes a run: the Python API `jaxdl train` calls, and a sweep before it
writes anything.

The bases: a tiny Llama transformers saved (`conftest.hf_model`, `hf_reference.TOKENIZED_LLAMA`:
4 heads over 2 key/value heads, 2 layers, 32 wide, 96 ids) and a jaxdl LoRA run fine-tuned from
it; the devices are conftest's four emulated CPUs under `parallel.strategy=fsdp`. Today's route
(before this change) stays callable from the module's public pieces, so each state is compared
bit for bit with it: the whole random init on the devices, then the base read into its shardings
(`merge_base`), then the optimizer state from the result.
"""

import dataclasses
import json

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.models import lora
from jaxdl.schema import ConfigError
from jaxdl.generative import evaluation
from jaxdl.train import build, init_from
from jaxdl.train import run as train_run

import hf_reference

SHORT = ["train.steps=2", "train.plot=False", "data.batch_size=8", "data.eval_batch_size=8",
         "data.max_eval_windows=8", "parallel.strategy=fsdp", "parallel.devices=4"]


@pytest.fixture(scope="module")
def base(hf_model, tmp_path_factory):
  """(root, the Llama's folder, chat data prepared with its tokenizer)."""
  root = tmp_path_factory.mktemp("finetune_init")
  llama = hf_model("llama", **hf_reference.TOKENIZED_LLAMA)
  records = [{"prompt": f"the quick fox {i}", "response": f"the lazy dog {i}"} for i in range(40)]
  (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert cli.main(["data", "prepare", str(root / "chat.jsonl"), "--tokenizer", llama,
                   "--out", str(root / "chat")]) == 0
  return root, llama, str(root / "chat")


class LoadWatch:
  """Records, each time a base is read (`init_from.base_params`), the device arrays that came
  to life since the last `mark()` (`jax.live_arrays`: what the devices hold at that moment;
  the arrays live at the mark are held, so no id of theirs is reused)."""

  def __init__(self, monkeypatch):
    self.seen, self.before = [], []
    load = init_from.base_params

    def spy(*args, **kwargs):
      held = {id(x) for x in self.before}
      self.seen.append([x for x in jax.live_arrays() if id(x) not in held])
      return load(*args, **kwargs)

    monkeypatch.setattr(init_from, "base_params", spy)

  def mark(self):
    self.before = jax.live_arrays()


def todays_route(run, shardings, path: str):
  """The state as `Run.init_state` made it before this change: `init_fn` whole (every base leaf
  drawn at random on the devices), then the base read into those leaves' shardings, then the
  optimizer state initialized from the merged parameters."""
  full = jax.jit(run.init_fn(), out_shardings=shardings)(run.init_key)
  params = init_from.merge_base(full.params, init_from.base_params(
      path, run.model, init_from.placement(full.params)), path)
  opt_state = jax.jit(run.tx.init, out_shardings=shardings.opt_state)(params)
  return dataclasses.replace(full, params=params, opt_state=opt_state)


def nbytes(arrays) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(arrays))


def init_watched(overrides, experiment, monkeypatch):
  """(run, its shardings, its initial state made by `Run.init_state` under fsdp over 4 devices,
  the arrays that came to life on the devices before the base was read, `LoadWatch`)."""
  config, _ = load_config(experiment, [*overrides, *SHORT])
  run = build(config)
  shardings = run.strategy.state_shardings(run.abstract_state())
  watch = LoadWatch(monkeypatch)
  watch.mark()
  state = run.init_state(shardings)
  (at_load,) = watch.seen
  assert sum(not x.is_fully_replicated for x in jax.tree.leaves(state.params)) >= 5
  return run, shardings, state, at_load


def base_bytes(state) -> int:
  """The bytes of the parameters the base supplies (all but the adapters)."""
  return nbytes(state.params) - nbytes(init_from.without_base(state).params)


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
  """The LoRA fine-tune of the Llama: when the base is read the devices hold nothing of the run
  but its adapters and its int32 step (today's route held a whole random parameter set there,
  and the spy sees it), and the state equals today's route's bit for bit, leaf by leaf, in the
  same shardings: the adapters are drawn by the run's own init on the run's key, so a re-run or
  a resume is the same run. Returns that run saved as a jaxdl run (config.json, a
  checkpoint of its params, `evaluation.save_run`, its adapters B set nonzero), a base for the
  next test."""
  _, llama, chat = base
  with pytest.MonkeyPatch.context() as mp:
    run, shardings, state, at_load = init_watched([f"init_from={llama}", f"data.path={chat}"],
                                                  "finetune_lora", mp)
    watch = LoadWatch(mp)
    watch.mark()
    old = todays_route(run, shardings, llama)
  adapters = init_from.without_base(state).params
  assert run.model.lora_rank == 8 and len(adapters) == 2 * 6  # A, B at 6 sites (layers stacked)
  assert base_bytes(state) > 20_000
  assert nbytes(at_load) == nbytes(adapters) + 4, [x.shape for x in at_load]
  assert nbytes(watch.seen[0]) >= nbytes(adapters) + base_bytes(state)  # today's route
  assert jax.tree.structure(state) == jax.tree.structure(old)
  for (p, x), y in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(old)):
    assert x.dtype == y.dtype and x.sharding == y.sharding, p
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(p))
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: x + 0.05 if lora.path_str(p).endswith("/b") else x, state.params)
  workdir = tmp_path_factory.mktemp("runs") / "lora_run"
  evaluation.save_run(workdir, run.config, jax.device_get(params), step=2)
  return str(workdir), run.model, jax.device_get(params)


def test_a_lora_fine_tune_of_a_hugging_face_base_holds_one_copy_and_todays_values(lora_run):
  """The `lora_run` fixture's checks, as a test of their own."""
  assert lora_run


def test_a_full_fine_tune_of_a_jaxdl_run_holds_one_copy_of_the_base(base, lora_run,
                                                                    monkeypatch):
  """A full fine-tune whose base is the LoRA run: no adapter, so when the base is read the
  devices hold the run's step alone, and the init that remains, compiled, holds no
  parameter-sized buffer (its output and temporaries: a few bytes, against the base's bytes on
  each device); the parameters are the run's with W + (alpha / r) A B folded in (float32
  rounding of the same sum) and the optimizer state starts from them (AdamW's moments at 0),
  the same on the default device when no sharding is asked for."""
  _, _, chat = base
  workdir, model, saved = lora_run
  run, shardings, state, at_load = init_watched([f"init_from={workdir}", f"data.path={chat}"],
                                                "finetune_lora:full", monkeypatch)
  assert run.model.lora_rank == 0 and not init_from.without_base(state).params
  assert nbytes(at_load) == 4, [x.shape for x in at_load]
  memory = init_from.fresh_init(run.init_fn(), shardings).lower(
      run.init_key).compile().memory_analysis()
  per_device = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state.params))
  assert per_device > 5_000
  assert memory.output_size_in_bytes + memory.temp_size_in_bytes <= 64, memory
  _, merged = lora.merge(model, jax.tree.map(jax.numpy.asarray, saved))
  assert jax.tree.structure(merged) == jax.tree.structure(state.params)
  for (p, x), y in zip(jax.tree_util.tree_leaves_with_path(state.params),
                       jax.tree.leaves(merged)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7,
                               err_msg=jax.tree_util.keystr(p))
  # Unplaced (what the doctor and the benchmarks ask for): the same state on the default device.
  plain = run.init_state()
  for x, y in zip(jax.tree.leaves(plain), jax.tree.leaves(state)):
    assert x.sharding.device_set == {jax.devices()[0]} and x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.shape in
             {y.shape for y in jax.tree.leaves(state.params)} and x.ndim]
  assert len(moments) == 2 * len(jax.tree.leaves(state.params))
  assert all(not np.any(np.asarray(m)) for m in moments)


def test_the_python_api_refuses_an_architecture_key_beside_init_from(base, tmp_path):
  """`jaxdl.train.run(config, workdir, overrides=...)`, what `jaxdl train` calls, refuses the key
  the base decides, before the workdir exists; the run's own keys pass its check."""
  _, llama, chat = base
  sets = [f"init_from={llama}", f"data.path={chat}", "model.n_layer=3"]
  config, _ = load_config("finetune_lora", sets)
  with pytest.raises(ConfigError, match=r"^model\.n_layer: 3 is set, but the run takes its "
                                         r"architecture from the base .*, whose n_layer is 2"):
    train_run(config, tmp_path / "run", progress=False, overrides=sets)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags,where", [
    (["--set", "model.n_layer=3", "--grid", "optim.lr=1e-3,3e-3"], ""),
    (["--grid", "model.n_layer=2,3"], " (point model.n_layer=3)"),
    (["--set", "model.d_model=64", "--search", "random", "--trials", "2", "--space",
      "optim.lr=loguniform:1e-4:1e-2"], " (--space optim.lr)"),
], ids=["shared", "grid", "search"])
def test_a_sweep_refuses_an_architecture_key_beside_init_from_before_writing(
    base, tmp_path, capsys, flags, where):
  """Exit 2, one line naming the key (and the point or the searched key it came with), and the
  sweep's folder never created."""
  _, llama, chat = base
  out = tmp_path / "sweep"
  argv = ["sweep", "finetune_lora", "--out", str(out), "--set", f"init_from={llama}",
          "--set", f"data.path={chat}", *flags]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  key = "n_layer" if "n_layer" in " ".join(flags) else "d_model"
  assert len(err) == 1 and err[0].startswith(f"jaxdl: error: model.{key}: ") and \
      err[0].endswith(where), err
  assert "takes its architecture from the base" in err[0]
  assert list(tmp_path.iterdir()) == []
