"""Every notebook in notebooks/ executes top to bottom and writes its figures.

The kernel is this interpreter (a temporary kernelspec whose argv is `sys.executable`), so the
test works in a fresh virtual environment without `ipykernel install`. Figures go to a temporary
folder (JAXDL_FIGURES), so running the tests leaves the committed thumbnails alone.
"""

import json
import os
import pathlib
import resource
import sys
import time

import pytest

import warm_python

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NAMES = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
# The figures each notebook must write (the stems under notebooks/figures/).
FIGURES = {
    "01_initialization": ["01_variance_per_layer", "01_plain_vs_residual"],
    "02_optimizers": ["02_sgd_vs_momentum", "02_adamw_vs_l2"],
    "03_schedules": ["03_schedules", "03_extension"],
    "04_normalization": ["04_batchnorm_moons", "04_pre_vs_post_ln"],
    "05_attention": ["05_worked_example", "05_char_gpt_attention"],
    "06_generative": ["06_two_points", "06_toy2d_by_steps", "06_digits_guidance", "06_families"],
    "07_debugging": ["07_loss_curves"],
    "08_finetuning": ["08_loss_curve"],
}
KERNEL = "jaxdl-test-python"
# Notebooks that compute more than they compile run without the suite's fast-compile flags:
# 01's 512-wide ReLU stacks took 33 CPU-s with them and 22 without; 04 (GPT gradients, BatchNorm
# runs: compile-bound) went the other way, 53 -> 79.
KERNEL_OPTIMIZED = "jaxdl-test-python-optimized"
OPTIMIZED = {"01_initialization"}
# The kernel process: the kernel and matplotlib imported with the garbage collector paused, then
# the library through `jaxdl.cli.load_library_frozen` (as a `jaxdl` process does), which freezes
# everything imported so far and resumes the collector; full collections during the notebook's
# tracing then walk only its own objects. The notebook's own imports find the modules loaded;
# what it computes is unchanged. The collector then runs at the suite's thresholds
# (`warm_python.GC_THRESHOLDS`).
LAUNCHER = f"""import gc
gc.disable()
import matplotlib.pyplot  # noqa: F401
from ipykernel import kernelapp
from jaxdl.cli import load_library_frozen
load_library_frozen()
gc.set_threshold{warm_python.GC_THRESHOLDS}
kernelapp.launch_new_instance()
"""


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
  """A kernelspec for this interpreter, found through JUPYTER_PATH."""
  root = tmp_path_factory.mktemp("jupyter")
  # One CPU device in the kernel: the notebooks are about the course, not parallelism, and the
  # suite's four emulated devices only add sharded compiles to their training runs.
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  for name, kernel_flags in ((KERNEL, flags), (KERNEL_OPTIMIZED, [])):
    spec = root / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "launch.py").write_text(LAUNCHER)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(spec / "launch.py"), "-f", "{connection_file}"],
        "display_name": "jaxdl tests", "language": "python",
        "env": {"XLA_FLAGS": " ".join(kernel_flags +
                                      ["--xla_force_host_platform_device_count=1"])}}))
  return root


def test_every_notebook_is_listed_and_stripped():
  assert NAMES == sorted(FIGURES)
  for name in NAMES:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
      assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs in git"
    assert "from jaxdl" in "".join(c.source for c in code), name


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_and_writes_its_figures(name, kernel_env, tmp_path, monkeypatch):
  figures = tmp_path / "figures"
  monkeypatch.setenv("JUPYTER_PATH", str(kernel_env))
  monkeypatch.setenv("JAXDL_FIGURES", str(figures))
  monkeypatch.setenv("JAXDL_RUNS", str(tmp_path / "no_runs"))  # 06 trains its smoke models
  # One CPU device in the kernel (the test session emulates four), one thread per op.
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
  t0 = time.perf_counter()
  cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
  kernel = KERNEL_OPTIMIZED if name in OPTIMIZED else KERNEL
  client = nbclient.NotebookClient(nb, kernel_name=kernel, timeout=240,
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  elapsed = time.perf_counter() - t0
  cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the kernel, once it has exited
  cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
  written = sorted(p.stem for p in figures.glob("*.png"))
  assert written == sorted(FIGURES[name]), written
  for p in figures.glob("*.png"):
    assert p.stat().st_size > 2000, p
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]
  assert not errors
  print(f"{name}: {elapsed:.1f}s wall, {cpu:.1f}s kernel CPU")
