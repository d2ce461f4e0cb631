"""PTX -> cubin through the NVIDIA driver's own JIT linker (`libcuda.so.1`: cuLinkCreate/AddData/Complete), for the
NV device on a machine that has the driver but no ptxas (no CUDA toolkit, no `nvidia-cuda-nvcc` wheel).

The linker needs a current context: the device's primary context (cuDevicePrimaryCtxRetain) is made current once.
The cubin is the one the driver would load itself (`CU_JIT_TARGET` = the NV device's sm version).
"""
from __future__ import annotations

from typing import Any

from tiny_uop.device import CompileError, Compiler

from tiny_runtime_nv.cuda_api import JIT_INPUT_PTX, JIT_TARGET, CUDAError, Driver, ffi


class DriverJITCompiler(Compiler):
  """Assembles PTX for `arch` ("sm_90") with libcuda's JIT linker; `drv` a `cuda.Driver` (the real one by default)."""

  def __init__(self, arch: str = "sm_90", drv: Driver | None = None):
    self.arch, self._drv = arch, drv
    self._ctx: Any = None
    super().__init__(f"cujit_{arch}")

  def _driver(self) -> Driver:
    if self._drv is None: self._drv = Driver.open()
    if self._ctx is None:
      drv = self._drv
      drv.call("cuInit", 0)
      d, ctx = ffi.new("CUdevice *"), ffi.new("CUcontext *")
      drv.call("cuDeviceGet", d, 0)
      drv.call("cuDevicePrimaryCtxRetain", ctx, d[0])
      self._ctx = ctx[0]
    self._drv.call("cuCtxSetCurrent", self._ctx)
    return self._drv

  def compile(self, src: str) -> bytes:
    """The cubin of PTX `src` (CompileError with the driver's reason when it is rejected)."""
    drv = self._driver()
    opts = ffi.new("int[1]", [JIT_TARGET])
    vals = ffi.new("void *[1]", [ffi.cast("void *", int(self.arch.removeprefix("sm_")))])
    state = ffi.new("CUlinkState *")
    drv.call("cuLinkCreate_v2", 1, opts, vals, state)
    try:
      data = ffi.new("char[]", src.encode())
      try: drv.call("cuLinkAddData_v2", state[0], JIT_INPUT_PTX, data, len(data), b"kernel.ptx", 0, ffi.NULL, ffi.NULL)
      except CUDAError as e: raise CompileError(f"the driver's JIT rejected the PTX for {self.arch}: {e}") from e
      out, size = ffi.new("void **"), ffi.new("size_t *")
      drv.call("cuLinkComplete", state[0], out, size)
      return bytes(ffi.buffer(out[0], size[0]))
    finally: drv.lib.cuLinkDestroy(state[0])
