"""The import graph of every package has no circle but the IR core's (issue #33).

The graph is built from the source with `ast` (nothing is imported): one node per module of `packages/*/tiny_*`, an
edge for every `import`/`from ... import` of another of those modules, at module level AND inside functions. A
function-level import breaks a circle only at import time: the two modules still cannot be understood, tested or
moved apart, so it counts. Imports under `if TYPE_CHECKING:` are left out (they never run). `from pkg import name` is
an edge to `pkg.name` when that is a module, else to `pkg`.

A strongly connected component of more than one module is a circle. The IR core (`uop`, `alu`, `pattern`,
`symbolic`, `trace`: the node, its evaluation, rewriting, the simplifier and tracing are one design) is the one circle
allowed. `KNOWN_CIRCLES` lists those not broken yet: it must only shrink (the test fails on a new circle, and on a
listed one that is gone, so that it is taken off the list).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IR_CORE = frozenset({"tiny_uop.alu", "tiny_uop.pattern", "tiny_uop.symbolic", "tiny_uop.trace", "tiny_uop.uop"})

KNOWN_CIRCLES: set[frozenset[str]] = set()  # none left: only the IR core's own circle (issue #33)


# docs/ARCHITECTURE.md §1's table, "depends on" (in-repository packages only): imports point down it, transitively
DEPENDS_ON: dict[str, set[str]] = {
  "tiny_uop": set(),
  "tiny_codegen": {"tiny_uop"},
  "tiny_runtime_cpu": {"tiny_uop", "tiny_codegen"},
  "tiny_runtime_amd": {"tiny_uop", "tiny_codegen"},
  "tiny_runtime_nv": {"tiny_uop", "tiny_codegen"},
  "tiny_runtime_qcom": {"tiny_uop", "tiny_codegen"},
  "tiny_tensor": {"tiny_uop", "tiny_codegen", "tiny_runtime_cpu"},
  "tiny_torch": {"tiny_tensor"},
}


def package_modules() -> dict[str, Path]:
  """Every module of every package: dotted name -> file."""
  mods: dict[str, Path] = {}
  for pkg in sorted((ROOT / "packages").glob("*/tiny_*")):
    if not (pkg / "__init__.py").exists(): continue
    for f in sorted(pkg.rglob("*.py")):
      parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
      if parts[-1] == "__init__": parts.pop()
      mods[".".join(parts)] = f
  return mods


def _is_type_checking(node: ast.AST) -> bool:
  return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imported(mod: str, is_pkg: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
  """The dotted names an import statement in `mod` names (relative imports resolved)."""
  if isinstance(node, ast.Import): return [a.name for a in node.names]
  base = node.module or ""
  if node.level:
    parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    base = ".".join(parts + ([node.module] if node.module else []))
  return [f"{base}.{a.name}" for a in node.names] + [base]


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
  """module -> the modules of `mods` it imports (module level and inside functions; not under TYPE_CHECKING)."""
  graph: dict[str, set[str]] = {m: set() for m in mods}
  for mod, path in mods.items():
    stack: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
    while stack:
      node = stack.pop()
      if _is_type_checking(node): continue
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = _imported(mod, path.name == "__init__.py", node)
        # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
        subs = [n for n in names[:-1] if n in mods] if isinstance(node, ast.ImportFrom) else []
        for name in subs or (names if isinstance(node, ast.Import) else names[-1:]):
          while name and name not in mods: name = name.rpartition(".")[0]
          if name and name != mod: graph[mod].add(name)
      stack.extend(ast.iter_child_nodes(node))
  return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm, with an explicit stack)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  on_stack: set[str] = set()
  stack: list[str] = []
  out: set[frozenset[str]] = set()
  for root in sorted(graph):
    if root in index: continue
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    work = [(root, iter(sorted(graph[root])))]
    while work:
      v, succ = work[-1]
      for w in succ:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w)
          on_stack.add(w)
          work.append((w, iter(sorted(graph[w]))))
          break
        if w in on_stack: low[v] = min(low[v], index[w])
      else:
        work.pop()
        if work: low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = set()
          while (w := stack.pop()) != v:
            on_stack.discard(w)
            comp.add(w)
          on_stack.discard(v)
          comp.add(v)
          if len(comp) > 1: out.add(frozenset(comp))
  return out


def test_the_graph_sees_imports_in_functions_and_relative_ones():
  mods = package_modules()
  assert len(mods) > 150 and "tiny_uop.uop" in mods and "tiny_tensor.nn.onnx" in mods
  graph = import_graph(mods)
  assert "tiny_uop.uop" in graph["tiny_uop.pattern"]      # module level
  assert IR_CORE in circles(graph)                        # uop -> alu/pattern/symbolic/trace happen in functions


def test_circles_on_a_known_graph():
  g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
  assert circles(g) == {frozenset("abc"), frozenset("de")}


def test_only_the_ir_core_and_the_known_circles_remain():
  found = circles(import_graph(package_modules()))
  new = found - KNOWN_CIRCLES - {IR_CORE}
  assert not new, f"new import circles (move the shared piece down, or pass it in): {sorted(map(sorted, new))}"
  gone = KNOWN_CIRCLES - found
  assert not gone, f"circles no longer there: take them off KNOWN_CIRCLES: {sorted(map(sorted, gone))}"


def _allowed(pkg: str) -> set[str]:
  """The packages `pkg` may import: its dependencies and theirs."""
  out: set[str] = set()
  todo = [pkg]
  while todo:
    for d in DEPENDS_ON[todo.pop()] - out:
      out.add(d)
      todo.append(d)
  return out


def test_imports_follow_the_package_layers():
  # e.g. a runtime's selftest reaching up into tiny-tensor (its conformance suite runs in a child process instead)
  graph = import_graph(package_modules())
  assert {m.split(".")[0] for m in graph} == set(DEPENDS_ON)
  bad = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
               if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in _allowed(m.split(".")[0]))
  assert not bad, f"imports against docs/ARCHITECTURE.md's package table: {bad}"

