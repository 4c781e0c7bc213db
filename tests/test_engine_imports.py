"""No modules of jaxdl's packages import each other in a circle, even through an import inside
a function (tests/test_architecture.py checks the module-level imports; a lazy import hides a
circle from it, as train/fsdp.py <-> train/sharding_rules.py and data/chat.py <-> data/prepare.py
did), and JAX internals are imported by the XLA:CPU seam alone."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxdl"
PACKAGES = tuple(sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()))


def _edges(package: str) -> dict[str, set[str]]:
  """module -> the modules of jaxdl's packages it imports, anywhere in its file."""
  names = {f"jaxdl.{pkg}.{p.stem}" for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")
           if p.stem != "__init__"}
  graph = {}
  for path in (ROOT / package).glob("*.py"):
    if path.stem == "__init__":
      continue
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        deps |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module:
        deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    graph[f"jaxdl.{package}.{path.stem}"] = (deps & names) - {f"jaxdl.{package}.{path.stem}"}
  return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import circle of `graph` (a depth-first search's back edge), or None."""
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for d in sorted(graph.get(m, ())):
      if state.get(d) == 1:
        return stack[stack.index(d):] + [d]
      if d not in state and (found := visit(d)):
        return found
    state[m] = 2
    stack.pop()
    return None

  for m in sorted(graph):
    if m not in state and (found := visit(m)):
      return found
  return None


def test_no_import_circle_in_any_package():
  graph = {m: d for pkg in PACKAGES for m, d in _edges(pkg).items()}
  assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_walk_finds_a_circle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


INTERNALS_ELSEWHERE: set = set()  # none: the seam is the only one


def test_jax_internals_are_imported_by_the_xla_cpu_seam_only():
  """`jax._src`, `jax.extend` and jaxpr evaluation (`eval_jaxpr`, `jaxpr_as_fun`) appear in
  jaxdl/train/xla_cpu.py only: a JAX release that changes them breaks one module."""
  import re
  pattern = re.compile(r"^\s*(from|import)\s+jax\.(_src|extend)\b|eval_jaxpr|jaxpr_as_fun")
  users = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
           if any(pattern.search(line) for line in p.read_text(encoding="utf-8").splitlines())}
  assert users - INTERNALS_ELSEWHERE == {"train/xla_cpu.py"}, sorted(users)
