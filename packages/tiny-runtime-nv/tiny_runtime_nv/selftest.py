"""Hardware check for a machine with an NVIDIA GPU: `python -m tiny_runtime_nv.selftest` (from the source tree:
`PYTHONPATH=packages/tiny-uop:packages/tiny-codegen:packages/tiny-runtime-cpu:packages/tiny-runtime-nv:`
`packages/tiny-tensor python -m tiny_runtime_nv.selftest`; this process needs numpy and cffi only, imports no
llvmlite, and never imports tiny-tensor).

1. driver and GPU info (libcuda: driver version and devices; the NV device: the RM driver version, GPU, classes);
2. on each NVIDIA device that opens (`CUDA` through libcuda, `NV` through the RM ioctls; one that can't open says
   why): kernels built from UOps by tiny-codegen and launched through the device API, against numpy (elementwise,
   a row reduction, an fp16 matmul with float accumulation);
3. when tiny-tensor is installed, its conformance suite on the device in a child process (`python -m
   tiny_tensor.conformance --device NV --speed ...`: elementwise, reductions, matmuls incl. fp16/bf16 through tensor
   cores, a conv, softmax, copies, TinyJit replays and device graphs against numpy; then fp16/bf16 GEMM TFLOPS, device
   copy GB/s and TinyJit replay µs, next to torch on cuda when installed).
Exit status 0 when every check passed, 1 when one failed, 2 when there is no NVIDIA GPU (said at once, with why).
`--mock` runs steps 2-3 on MOCK+CUDA and MOCK+NV with small sizes (what the unit test does); `--quick` shrinks the
sizes. The NV device builds cubins with NVIDIA's ptxas (PTXAS=..., a CUDA toolkit, the nvidia-cuda-nvcc wheel) or
libcuda's JIT. The steps, the checks and the exit status are tiny-uop's shared selftest
(`tiny_uop.plugins.selftest`); this module says what is NVIDIA's: the libcuda and RM probe, the mock devices, how a
device describes itself.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from tiny_uop.plugins import selftest

DEVICES = {"CUDA": "tiny_runtime_nv.cuda:CUDADevice", "NV": "tiny_runtime_nv.device:NVDevice"}  # MOCK+ too


def probe() -> tuple[list[str], list[str], list[str]]:
  """(info lines, reasons there is no usable NVIDIA GPU, the devices to check: CUDA and NV when libcuda sees a
  device or the RM driver is loaded, none otherwise) without opening a device."""
  from tiny_runtime_nv import cuda
  info, missing = [], []
  try:
    drv = cuda.Driver.open()
    drv.call("cuInit", 0)
    v, n = cuda.ffi.new("int *"), cuda.ffi.new("int *")
    drv.call("cuDriverGetVersion", v)
    drv.call("cuDeviceGetCount", n)
    info.append(f"libcuda: driver API {v[0] // 1000}.{v[0] % 1000 // 10}, {n[0]} device(s)")
    if n[0] == 0: missing.append("libcuda reports no CUDA device")
  except (RuntimeError, OSError) as e: missing.append(f"CUDA: {e}")
  if not os.path.exists("/dev/nvidiactl"):
    missing.append("NV: /dev/nvidiactl missing (NVIDIA kernel driver not loaded)")
  else: info.append("NV: /dev/nvidiactl present")
  cuda_ok = any(line.startswith("libcuda") for line in info) and not any(m.startswith("libcuda reports no")
                                                                        for m in missing)
  return info, missing, ["CUDA", "NV"] if cuda_ok or any(line.startswith("NV:") for line in info) else []


def describe(dev: str, d: Any) -> str:
  """The opened device: its GPU name and arch; through the RM ioctls also the driver version and classes."""
  extra = f", driver {d.rm.version}, classes {d.compute_class:#x}/{d.dma_class:#x}" if hasattr(d, "rm") else ""
  return f"{getattr(d, 'name', '') or 'GPU'} arch {d.arch}{extra}"


def _get_program(ast: Any, renderer: Any) -> Any:
  from tiny_codegen import get_program
  return get_program(ast, renderer)


# no copy round trip; a device that does not open (CUDA or NV) is reported and the other one still checked
SPEC = selftest.SelfTest(gpu="NVIDIA GPU", devices=DEVICES, probe=probe, mock_devices=lambda: ["MOCK+CUDA", "MOCK+NV"],
                         describe=describe, get_program=_get_program, sizes=(32, 32, 256), mock_gemm=64,
                         interfaces=(), copy_round_trip=False, unavailable_fails=False, torch="cuda")


def main(argv: list[str]) -> int:
  """Run the checks (see the module docstring); the exit status."""
  return selftest.main(SPEC, argv)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
