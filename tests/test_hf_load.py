"""`jaxdl.models.hf.load_hf` reads weights as large models need: tensor by tensor (the headers
first, nothing read until a parameter is assembled), in the checkpoint's own dtype (bf16 stays
bf16), and a PyTorch-only directory is refused in one line without torch. The peak host memory
is `jaxdl bench --only hf_load`'s (jaxdl.bench.hf_load), run here at a tiny size.
"""

import json
import os
import shutil
import sys

import hf_reference
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.models import hf



@pytest.fixture(scope="module")
def llama(hf_model):
  """A tiny Llama transformers saved in 5 shards, its tokenizer.json beside it."""
  return hf_model("llama", **hf_reference.TOKENIZED_LLAMA)


def _bf16_copy(llama, tmp_path):
  """The llama with its weights rounded to bf16 (in shards), config unchanged."""
  out = tmp_path / "bf16"
  out.mkdir()
  shutil.copy(os.path.join(llama, "config.json"), out)
  tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in hf.read_weights(llama).items()}
  hf.write_weights(str(out), tensors, max_shard_bytes=sum(t.nbytes for t in tensors.values()) // 2)
  return out, tensors


def test_a_bf16_checkpoint_loads_as_bf16_and_exactly(llama, tmp_path):
  out, tensors = _bf16_copy(llama, tmp_path)
  assert len(hf.weight_files(str(out))) >= 2
  model, params = hf.load_hf(str(out))
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  assert model.param_dtype == jnp.bfloat16
  # Moved, never rounded: layer 1's stacked q projection is the bf16 tensor transposed.
  q = np.asarray(params["h"]["attn"]["c_attn"]["kernel"][1][:, :32])
  np.testing.assert_array_equal(q, tensors["model.layers.1.self_attn.q_proj.weight"].T)
  head = np.asarray(params["lm_head"]["kernel"])
  np.testing.assert_array_equal(head, tensors["lm_head.weight"].T)
  # Asked for float32, the same values widened exactly.
  _, wide = hf.load_hf(str(out), param_dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(wide["lm_head"]["kernel"]), head.astype(np.float32))


def test_an_fp32_checkpoint_stays_fp32_and_the_unrolled_layout_matches_the_scanned(llama):
  _, scanned = hf.load_hf(llama)
  _, unrolled = hf.load_hf(llama, scan_layers=False)
  assert {x.dtype for x in jax.tree.leaves(scanned)} == {jnp.dtype(jnp.float32)}
  for i in range(2):
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[i], scanned["h"])),
                    jax.tree.leaves(unrolled[f"h_{i}"])):
      np.testing.assert_array_equal(a, b)


def test_weights_are_indexed_from_headers_and_read_one_tensor_at_a_time(llama, monkeypatch):
  index = hf.index_weights(llama)
  assert all(isinstance(t, hf.LazyTensor) for t in index.values())
  reads = []
  real = hf.LazyTensor.__array__
  monkeypatch.setattr(hf.LazyTensor, "__array__",
                      lambda self, *a, **k: reads.append(self.shape) or real(self, *a, **k))
  a = np.asarray(index["model.norm.weight"])
  assert reads == [(32,)] and a.dtype == np.float32
  np.testing.assert_array_equal(a, hf.read_safetensors(
      os.path.join(llama, json.load(open(os.path.join(llama, hf.INDEX)))["weight_map"][
          "model.norm.weight"]))["model.norm.weight"])


def test_a_pytorch_only_directory_without_torch_is_one_line_exit_2(llama, tmp_path, monkeypatch,
                                                                  capsys):
  (tmp_path / "config.json").write_text(open(os.path.join(llama, "config.json")).read())
  (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
  monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
  text = tmp_path / "t.txt"
  text.write_text("the quick brown fox", encoding="utf-8")
  shutil.copy(os.path.join(llama, "tokenizer.json"), tmp_path)
  assert cli.main(["eval", str(tmp_path), "--text", str(text)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "holds only PyTorch weights (pytorch_model.bin)" in err[0]
  assert "pip install torch" in err[0] and "save_pretrained('OUT')" in err[0]


def test_the_hf_load_bench_checkpoint_loads_in_bf16_at_a_tiny_size(tmp_path):
  """The bench's generated checkpoint and its in-process measurement (the bench runs it in a
  fresh process, `python -m jaxdl.bench.hf_load`, so the peak is the loading's alone)."""
  from jaxdl.bench import hf_load
  size = hf_load.SIZES["tiny"]
  disk = hf_load.write_checkpoint(size, str(tmp_path))
  n = hf_load.param_count(size)
  assert n == 512 * 64 + 64 + 2 * (2 * 64 + 64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 128)
  assert 2 * n <= disk < 2 * n + 16384  # bf16 plus the headers
  r = hf_load.measure_load(str(tmp_path))
  assert r["dtypes"] == ["bfloat16"] and r["param_bytes"] == 2 * n
  assert r["hwm"] >= r["rss_before"] > 0


def test_parameters_load_straight_into_their_shardings(llama):
  """On the suite's 4 CPU devices: the stacked MLP kernel split over its output axis, the
  embedding over its rows, the rest replicated; values equal the single-device load."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:4]), ("fsdp",))
  want = {("h", "mlp", "c_fc", "kernel"): P(None, None, "fsdp"),
          ("wte", "embedding"): P("fsdp", None)}
  sharding_of = lambda path: NamedSharding(mesh, want.get(path, P()))  # noqa: E731
  _, sharded = hf.load_hf(llama, shardings=sharding_of)
  _, plain = hf.load_hf(llama)
  for path, spec in want.items():
    leaf = sharded
    for k in path:
      leaf = leaf[k]
    assert leaf.sharding.spec == spec and len(leaf.addressable_shards) == 4
    assert leaf.addressable_shards[0].data.shape[-1 if path[0] == "h" else 0] == (
        leaf.shape[-1 if path[0] == "h" else 0] // 4)
  assert sharded["ln_f"]["scale"].sharding.spec == P()
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               sharded, plain)
