"""The QCOM compiler: OpenCL C -> the device OpenCL compiler's program binary, in tiny's container (`adreno.pack_lib`).

On an Adreno phone the OpenCL implementation is Qualcomm's (`libOpenCL.so`); `AdrenoCompiler` builds the source
there and takes the binary (`clGetProgramInfo(CL_PROGRAM_BINARIES)`), which `QCOMProgram` loads into GPU memory and
launches with its own command streams -- the OpenCL runtime never runs a kernel. A failed build raises CompileError
with the build log and the source. `MOCK+QCOM` has its own compiler with the same interface (`mock/compiler.py`).
"""
from __future__ import annotations

from typing import Any

from tiny_uop.device import CompileError, Compiler

from tiny_runtime_qcom import adreno
from tiny_runtime_qcom.opencl import CL_DEVICE_LOCAL_MEM_SIZE, CL_DEVICE_MAX_WORK_GROUP_SIZE, BuildError, Context, \
  info_int


class AdrenoCompiler(Compiler):
  """Builds with the first platform of the device's OpenCL (Qualcomm's on a phone); `extensions` and `limits` are
  that device's (clGetDeviceInfo)."""

  def __init__(self, arch: str, ctx: Context | None = None):
    self.ctx = ctx if ctx is not None else Context()
    if "adreno" not in (self.ctx.name + self.ctx.platform_name).lower():
      raise RuntimeError(f"the OpenCL device is {self.ctx.name!r} ({self.ctx.platform_name}), not an Adreno GPU: QCOM "
                         "needs Qualcomm's OpenCL compiler to make kernel binaries")
    self.extensions = self.ctx.extensions
    cl, dev = self.ctx.cl, self.ctx.device
    self.limits = {"max_workgroup_size": info_int(cl, "clGetDeviceInfo", dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, "size_t"),
                   "shared_max": info_int(cl, "clGetDeviceInfo", dev, CL_DEVICE_LOCAL_MEM_SIZE, "cl_ulong")}
    super().__init__(f"qcom_{arch}_{self.ctx.name}")

  def compile(self, src: str) -> bytes:
    info = adreno.KernelInfo.of_source(src)
    try: prg, _ = self.ctx.build(src, None)
    except BuildError as e: raise CompileError(str(e)) from e
    try: return adreno.pack_lib(info, self.ctx.binary(prg))
    finally: self.ctx.cl.clReleaseProgram(prg)

  def disassemble(self, lib: bytes) -> Any:
    info, blob = adreno.unpack_lib(lib)
    b = adreno.AdrenoBinary.parse(blob, info.name)
    return f"{info.name}: {len(b.image)} bytes of a6xx code, {b.fregs} full / {b.hregs} half registers, args {b.args}"
