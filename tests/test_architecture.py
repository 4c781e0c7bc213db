"""The package's shape: dependencies point one way and no module imports in a cycle.

Layers (a module may import its own package and the layers below, never one above):

  0  jaxdl.schema                                 (the settings primitive)
  1  jaxdl.config, jaxdl.disk_errors, jaxdl.stop_signals, jaxdl.cache
  2  jaxdl.data, jaxdl.models, jaxdl.optim        (not each other)
  3  jaxdl.train
  4  jaxdl.generative, jaxdl.doctor               (not each other)
  5  jaxdl.course, jaxdl.bench                    (not each other)
  6  jaxdl.cli, one module per command: the top layer, which nothing else imports
     (7: jaxdl.__main__, which runs it)

Every import counts, including ones inside functions: a lazy import of a higher layer is still a
dependency pointing the wrong way.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxdl"
LAYERS = {"schema": 0, "config": 1, "disk_errors": 1, "stop_signals": 1, "cache": 1,
          "data": 2, "models": 2, "optim": 2,
          "train": 3, "generative": 4, "doctor": 4, "course": 5, "bench": 5, "cli": 6,
          "__main__": 7, "__init__": 7}


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _is_module(name: str) -> bool:
  path = ROOT.parent.joinpath(*name.split("."))
  return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path: pathlib.Path) -> list[tuple[str, bool]]:
  """(imported jaxdl module, at module level?) for every import statement in the file."""
  tree = ast.parse(path.read_text())
  top_level = {id(node) for node in tree.body}
  package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent /
                                                                               "__init__.py")
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # relative: resolve against this module's package
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        module = f"{base}.{node.module}" if node.module else base
      else:
        module = node.module or ""
      # `from jaxdl.x import y` imports the submodule jaxdl.x.y when there is one.
      names = [f"{module}.{a.name}" if _is_module(f"{module}.{a.name}") else module
               for a in node.names]
    else:
      continue
    out += [(n, id(node) in top_level) for n in names if n == "jaxdl" or n.startswith("jaxdl.")]
  return out


def _modules():
  return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _layer(module: str) -> tuple[str, int]:
  parts = module.split(".")
  top = parts[1] if len(parts) > 1 else "__init__"
  assert top in LAYERS, f"{module}: package {top!r} has no layer in tests/test_architecture.py"
  return top, LAYERS[top]


def test_every_package_has_a_layer():
  for module in _modules():
    _layer(module)


def test_no_module_imports_a_layer_above_or_a_sibling_package():
  wrong = []
  for module, path in _modules().items():
    src_pkg, src_layer = _layer(module)
    for target, _ in _imports(path):
      if target == "jaxdl":
        continue
      dst_pkg, dst_layer = _layer(target)
      if dst_pkg != src_pkg and dst_layer >= src_layer:
        wrong.append(f"{module} imports {target}")
  assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycles_between_modules():
  """Module-level imports form a DAG (a cycle makes import order matter)."""
  modules = _modules()
  graph = {m: sorted({t for t, top in _imports(p) if top and t in modules and t != m})
           for m, p in modules.items()}
  # A package's __init__ importing its own submodules is the usual re-export, not a cycle
  # unless the submodule imports the package __init__ back at module level, which is kept.
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for t in graph[m]:
      if state.get(t) == 1:
        cycle = stack[stack.index(t):] + [t]
        # `pkg/__init__` -> `pkg.sub` -> `pkg` is Python's normal package import order.
        if not (len(cycle) == 3 and cycle[0] == cycle[2] and cycle[1].startswith(cycle[0] + ".")):
          raise AssertionError("import cycle: " + " -> ".join(cycle))
      elif t not in state:
        visit(t)
    stack.pop()
    state[m] = 2

  for m in graph:
    if m not in state:
      visit(m)


def test_the_checker_sees_a_wrong_way_import(tmp_path, monkeypatch):
  """The layering test can fail: a planted lazy import of the doctor inside train is found."""
  fake = tmp_path / "jaxdl" / "train"
  fake.mkdir(parents=True)
  (tmp_path / "jaxdl" / "__init__.py").write_text("")
  (fake / "__init__.py").write_text("")
  (fake / "loop.py").write_text("def f():\n  from jaxdl.doctor import run_preflight\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "jaxdl")
  with pytest.raises(AssertionError, match="jaxdl.train.loop imports jaxdl.doctor"):
    test_no_module_imports_a_layer_above_or_a_sibling_package()


@pytest.mark.slow
@pytest.mark.parametrize("package", ["train"])
def test_a_package_imports_without_the_layers_above(package):
  """Imported first in a fresh interpreter, a package loads nothing of a layer at or above its
  own but itself (train pulls in config, data, models and optim, and nothing else). One
  interpreter per package costs seconds, so only the engine is checked at run time; the static
  test above covers every module's imports."""
  code = (f"import sys, jaxdl.{package}; "
          f"others = sorted({{m.split('.')[1] for m in sys.modules if m.startswith('jaxdl.')}} "
          f"- {{'{package}'}}); print(','.join(others))")
  out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                       capture_output=True, text=True).stdout.split()[-1].split(",")
  assert out and all(LAYERS[p] < LAYERS[package] for p in out), out


def test_the_architecture_page_names_every_package_and_command():
  """docs/ARCHITECTURE.md is the map a contributor reads first: every package of jaxdl/ and every
  command of `jaxdl.cli.COMMANDS` must appear on it (a package as `jaxdl.<name>` or `<name>` in
  backticks, a command as a word of its diagram's command list or `jaxdl <command>`)."""
  from jaxdl.cli import COMMANDS
  page = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
  packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
  missing = [p for p in packages if f"jaxdl.{p}" not in page and f"`{p}`" not in page]
  assert not missing, f"docs/ARCHITECTURE.md does not name the package(s) {missing}"
  listed = page.split("one module per command", 1)[1].split(";", 1)[0]
  missing = [c for c in COMMANDS if c not in listed.replace("|", " ").split()]
  assert not missing, f"docs/ARCHITECTURE.md's command list lacks {missing}"
