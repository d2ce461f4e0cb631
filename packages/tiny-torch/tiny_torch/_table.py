"""The tables of aten ops the tiny device runs itself, and the decorators that fill them (registration next to
definition: `@op(aten.add.Tensor, promote=RESULT)` over a function in `tiny_torch.ops` or `tiny_torch.ops_nn`).

Kept below both op modules so that each fills the same tables without importing the other; `tiny_torch.ops`
re-exports every name here and adds `DECOMPS` once both are filled. What the tables mean: `tiny_torch.ops`'s docstring.
"""
from __future__ import annotations

from typing import Any, Callable

RESULT, OUT = "result", "out"
OPS: dict[Any, Callable[..., Any]] = {}
PROMOTE: dict[Any, str] = {}
NO_META: set[Any] = set()  # data-dependent output shapes: no meta run
RAW_OUT: set[Any] = set()  # the function returns torch values itself (bools, CPU tensors)
SPECIAL: dict[Any, Callable[..., Any]] = {}


def op(*funcs: Any, promote: str | None = None, meta: bool = True, raw: bool = False) -> Callable:
  """Register the decorated function as the tiny implementation of aten overloads `funcs`."""
  def deco(fn: Callable) -> Callable:
    for f in funcs:
      OPS[f] = fn
      if promote: PROMOTE[f] = promote
      if not meta: NO_META.add(f)
      if raw: RAW_OUT.add(f)
    return fn
  return deco


def special(*funcs: Any) -> Callable:
  """Register the decorated function for `funcs`, called with the raw arguments (TinyTensors, CPU tensors)."""
  def deco(fn: Callable) -> Callable:
    for f in funcs: SPECIAL[f] = fn
    return fn
  return deco
