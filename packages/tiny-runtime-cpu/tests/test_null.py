"""The NULL device compiles with whatever renderer DEV names and runs nothing."""

import numpy as np
import pytest

from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device
from tiny_uop.uop import KernelInfo, Ops, UOp

RENDERERS = {"NULL": "LLVMRenderer", "NULL:LLVM": "LLVMRenderer", "NULL:CLANG": "ClangRenderer",
             "NULL:PYTHON": "PythonRenderer"}


def add_ast(n=64):
  out, a = UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=1)
  r = UOp.range(n, 0)
  return UOp.sink(out.index(r).store(a.index(r).load() * 2.0), arg=KernelInfo("null_add"))


@pytest.mark.parametrize("dev", RENDERERS)
def test_compile_only(dev):
  from tiny_codegen import get_program
  null = Device["NULL"]
  with Context(DEV=dev):
    r = null.renderer
    assert type(r).__name__ == RENDERERS[dev]
    spec = get_program(add_ast(), r)
  assert spec.lib  # really compiled
  out, a = Buffer("NULL", 64, dtypes.float32), Buffer("NULL", 64, dtypes.float32)
  a.copyin(memoryview(np.ones(64, np.float32)))
  prg = null.get_program(spec.name, spec.lib)
  assert prg(out._buf, a._buf, global_size=spec.global_size, wait=True) == 0.0
  with pytest.raises(RuntimeError, match="NULL device buffers hold no data"): out.numpy()


def test_renderer_arch_and_unknown():
  null = Device["NULL"]
  with Context(DEV="NULL:LLVM:skylake"): assert null.renderer.arch == "skylake"
  with Context(DEV="NULL:NOPE"), pytest.raises(ValueError, match="unknown renderer 'NOPE'; installed:"):
    null.renderer  # noqa: B018
