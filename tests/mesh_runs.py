"""The engine runs the mesh-parallelism tests compare with one device
(tests/test_tensor_parallel.py, tests/test_sequence_parallel.py): a tiny Llama-shaped GPT through
the real engine (`jaxdl.train.run` on char_gpt:smoke): 8 query and 4 key/value heads of width 4,
SwiGLU of hidden width 64, RoPE, an untied head over the 256 bytes, one block, T = 16; plain
SGD, so the updates are linear in the gradients and sharding changes only the rounding.
"""

import shutil

import jax
import numpy as np

from jaxdl.config import load_config
from jaxdl.train import run
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics

STEPS, EVERY = 6, 2
# One unrolled block: a scanned stack costs about 1 CPU-s more per compiled run here (its leading
# layer axis is covered by the rules test).
TINY = ["model.d_model=32", "model.n_head=8", "model.n_kv_head=4", "model.n_layer=1",
        "model.scan_layers=False", "model.mlp='swiglu'", "model.mlp_hidden=64",
        "model.pos='rope'", "model.tie_embeddings=False", "model.block_size=16",
        "data.context_length=16", "data.batch_size=8", "data.max_eval_windows=8",
        "optim.name='sgd'", "optim.lr=0.5", f"train.steps={STEPS}", "train.eval_every=0",
        f"train.ckpt_every={EVERY}", "train.log_every=1", "train.plot=False",
        "train.count_flops=False"]
FINAL_ONLY = [f"train.ckpt_every={STEPS}"]  # for runs no other run resumes from


def config(*sets):
  return load_config("char_gpt:smoke", [*TINY, *sets])[0]


def result(workdir):
  """(losses of steps 1.., the newest record of each step, final parameters)."""
  _, state = load_state(workdir)
  loss = {r["step"]: r["loss"] for r in read_metrics(workdir, "train")}
  return np.array([loss[s] for s in sorted(loss)]), state["params"]


def train(workdir, *sets):
  run(config(*sets), workdir, progress=False)
  return result(workdir)


def resume(source, step, workdir, *sets):
  """`workdir` resumed from `source`'s checkpoint at `step` under `sets`: the steps after it."""
  shutil.copytree(source, workdir)
  for later in range(step + EVERY, STEPS + 1, EVERY):
    shutil.rmtree(workdir / "checkpoints" / str(later))
  assert run(config(*sets), workdir, progress=False)["start_step"] == step
  return result(workdir)


def close(a, b):  # tests/test_fsdp.py's tolerance
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def same_as_one_device(result_, one, last=None):
  (losses, params), (losses_1, params_1) = result_, one
  last = last or STEPS
  assert len(losses_1) == STEPS
  np.testing.assert_allclose(losses[-last:], losses_1[-last:], rtol=1e-5, atol=1e-6)
  jax.tree.map(close, params, params_1)
