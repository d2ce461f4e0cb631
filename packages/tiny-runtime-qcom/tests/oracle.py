"""Independent truth for the QCOM tests: the bindings in tinygrad 0.14.0's PyPI wheel (a test-only dependency, see
noxfile.py), which were generated from the headers and databases themselves -- never typed by hand here.

- `mesa()`: Mesa's Adreno register and packet database (`src/freedreno/registers/adreno/*.xml`) as tinygrad ships it,
  `tinygrad/runtime/autogen/mesa.py`, read as DATA (parsed with `ast`, never imported: importing it would load
  Mesa's shared library): every `NAME = int` and every enum member `(NAME:=int)`.
- `kgsl()`: `tinygrad/runtime/autogen/kgsl.py`, generated from the kernel's `msm_kgsl.h` (imported).
- `opencl()`: `tinygrad/runtime/autogen/opencl.py`, generated from Khronos' `CL/cl.h` (read as data).
- `ops_qcom()`: tinygrad's QCOM runtime, whose Adreno binary parser is the reference for the binary layout.
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from pathlib import Path
from typing import Any


def tinygrad_file(rel: str) -> Path:
  spec = importlib.util.find_spec("tinygrad")
  assert spec is not None and spec.origin is not None, "tinygrad==0.14.0 (a test dependency) is not installed"
  path = Path(spec.origin).parent / rel
  assert path.is_file(), f"{path} is missing from the tinygrad wheel"
  return path


_BINOPS = {ast.LShift: lambda a, b: a << b, ast.BitOr: lambda a, b: a | b, ast.Add: lambda a, b: a + b}


def _const(node: ast.expr) -> int | None:
  """An int literal, `-x`, or `a << b` / `a | b` / `a + b` of them (as `(1 << 3)`); None for anything else."""
  if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    return None if (v := _const(node.operand)) is None else -v
  if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
    a, b = _const(node.left), _const(node.right)
    return None if a is None or b is None else _BINOPS[type(node.op)](a, b)
  return None


def _int_names(path: Path) -> dict[str, int]:
  out: dict[str, int] = {}
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
      if (v := _const(node.value)) is not None: out[node.targets[0].id] = v
    elif isinstance(node, ast.NamedExpr) and (v := _const(node.value)) is not None: out[node.target.id] = v
  return out


@functools.cache
def mesa() -> dict[str, int]: return _int_names(tinygrad_file("runtime/autogen/mesa.py"))


@functools.cache
def opencl() -> dict[str, int]: return _int_names(tinygrad_file("runtime/autogen/opencl.py"))


def kgsl() -> Any: return importlib.import_module("tinygrad.runtime.autogen.kgsl")


def ops_qcom() -> Any: return importlib.import_module("tinygrad.runtime.ops_qcom")


def field(value: int, name: str) -> int:
  """The field `name` (e.g. "A6XX_TEX_CONST_1_WIDTH") of a register value, by Mesa's __MASK/__SHIFT."""
  m = mesa()
  return (value & m[f"{name}__MASK"]) >> m[f"{name}__SHIFT"]
