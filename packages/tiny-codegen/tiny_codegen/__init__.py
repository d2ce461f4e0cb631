"""tiny-codegen: kernel ASTs to programs — scheduler, optimizer hook, lowering pipeline, renderers and compilers.

>>> from tiny_codegen import to_program, get_program
>>> from tiny_codegen.renderer.llvmir import LLVMRenderer
>>> spec = get_program(kernel_ast, LLVMRenderer())   # doctest: +SKIP
>>> spec.name, spec.global_size, len(spec.lib) > 0   # doctest: +SKIP

`to_program(ast, renderer)` returns a PROGRAM UOp (SINK, DEVICE, LINEAR, SOURCE, BINARY); `get_program` the
`tiny_uop.device.ProgramSpec` a runtime launches (docs/PIPELINE.md §4).
"""
from __future__ import annotations

from typing import Any

__all__ = ["to_program", "get_program", "spec_from_program", "lower", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)


def __getattr__(name: str) -> Any:  # lazy: `import tiny_codegen` stays cheap (no llvmlite until it is needed)
  if name in ("to_program", "get_program", "spec_from_program"):
    from tiny_codegen import program
    return getattr(program, name)
  if name == "lower":
    from tiny_codegen.lower import lower
    return lower
  raise AttributeError(f"module 'tiny_codegen' has no attribute {name!r}")
