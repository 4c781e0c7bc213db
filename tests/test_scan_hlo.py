"""Scanned layers at no copy: the compiled HLO of the scanned GPT train step (what XLA runs, read
with `jax.jit(step).lower(...).compile().as_text()`) copies no full stacked parameter inside its
layer loops. A copy there would be paid once per layer per step: L x the whole stack."""

import dataclasses
import re

import jax

from jaxdl.bench import gpt

# L = 3 layers, d 64: a stacked leaf is (3, ...), a shape no per-layer array of the step has.
SETUP = dataclasses.replace(gpt.COMPILE_SETUP, n_layer=3)


def _computations(hlo: str) -> dict[str, list[str]]:
  """name -> instruction lines of each computation of an HLO module's text."""
  comps, name = {}, None
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$", line)
    if head:
      name = head.group(1)
      comps[name] = []
    elif name and line.strip() not in ("", "}"):
      comps[name].append(line.strip())
  return comps


def _reachable(comps: dict, roots: list[str]) -> set[str]:
  """The computations `roots` run, with the fusions, loops and calls inside them."""
  seen, todo = set(), list(roots)
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for line in comps[name]:
      todo += re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", line)
  return seen


def _shape(line: str) -> tuple[int, ...] | None:
  m = re.match(r"%[\w.\-]+ = \w+\[([\d,]*)\]", line.removeprefix("ROOT "))
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else None


def test_the_scanned_step_copies_no_stacked_parameter_in_its_loops():
  state, step = gpt.jaxdl_step(SETUP, abstract=True)  # scan_layers, unroll 1: the defaults
  batch = jax.eval_shape(lambda: gpt.random_batch(SETUP))
  hlo = step.lower(state, batch).compile().as_text()
  stacked = {tuple(x.shape) for x in jax.tree.leaves(state.params["h"])}
  assert all(s[0] == SETUP.n_layer for s in stacked)
  comps = _computations(hlo)
  bodies = [b for line in hlo.splitlines() for b in re.findall(r"body=%?([\w.\-]+)", line)]
  assert len(bodies) >= 2, "the forward and backward layer loops"
  inside = [line for c in _reachable(comps, bodies) for line in comps[c]]
  # The loops do see whole stacks (the gradients are written into them in place, one layer's
  # slice per iteration), so a copy of one would show here.
  assert any(_shape(line) in stacked and "dynamic-update-slice" in line for line in inside)
  copies = [line for line in inside
            if re.search(r" (copy|transpose)\(", line) and _shape(line) in stacked]
  assert not copies, "\n".join(copies)
