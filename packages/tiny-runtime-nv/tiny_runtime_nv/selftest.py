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
libcuda's JIT.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

DEVICES = {"CUDA": "tiny_runtime_nv.cuda:CUDADevice", "NV": "tiny_runtime_nv.device:NVDevice"}  # MOCK+ too
CPU_TARGET = "tiny_runtime_cpu.cpu:CPUDevice"  # for the conformance suite's copies to and from the host device


def _register() -> None:
  """Make CUDA/NV known without installed entry points (a bare source tree on PYTHONPATH)."""
  from tiny_uop.plugins import DevicePlugin, register_device
  for name, target in DEVICES.items(): register_device(DevicePlugin(name, target, priority=25))


def probe() -> tuple[list[str], list[str]]:
  """(info lines, reasons there is no usable NVIDIA GPU) without opening a device."""
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
  return info, missing


def _check(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> bool:
  err = float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) + 1e-9)) if want.size else 0.0
  ok = bool(np.isfinite(err) and err <= tol)
  print(f"  {'ok  ' if ok else 'FAIL'} {name:28s} rel err {err:.2e} (tol {tol:g})", flush=True)
  return ok


def _run_kernel(dev: str, ast: Any, out: tuple[int, Any], ins: list[tuple[np.ndarray, Any]]) -> np.ndarray:
  """Compile kernel `ast` (slot 0 = the output of `out` = (size, dtype), then `ins`) with tiny-codegen, run it on `dev`
  through the device API (no tiny-tensor) and return the output."""
  from tiny_codegen import get_program
  from tiny_uop.device import Buffer
  from tiny_uop.plugins import Device
  d = Device[dev]
  spec = get_program(ast, d.renderer)
  bufs = [Buffer(dev, out[0], out[1]).allocate()]
  bufs += [Buffer(dev, a.size, dt).copyin(memoryview(np.ascontiguousarray(a))) for a, dt in ins]
  d.get_program(spec.name, spec.lib)(*[bufs[g]._buf for g in spec.globals], global_size=spec.global_size,
                                     local_size=spec.local_size, vals=(), wait=True)
  return bufs[0].numpy()


def kernels(dev: str, n: int) -> bool:
  """Kernels built from UOps, compiled by tiny-codegen and launched through the device API, against numpy: an
  elementwise kernel, a row sum, and an fp16 matmul with float accumulation (tensor cores where the optimizer picks
  them). The tensor-level set is tiny-tensor's conformance suite (see `main`)."""
  from tiny_uop.dtype import dtypes
  from tiny_uop.uop import AxisType, KernelInfo, Ops, UOp

  def param(slot: int, size: int, dt: Any) -> UOp: return UOp(Ops.PARAM, dt.ptr(size), arg=slot)
  f32, f16 = dtypes.float32, dtypes.float16
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
  i, j, k = UOp.range(n * n, 0), UOp.range(n, 0), UOp.range(n, 1, AxisType.REDUCE)
  pa, pb, out = param(1, n * n, f32), param(2, n * n, f32), param(0, n * n, f32)
  x = pa.index(i).load()
  ew = UOp.sink(out.index(i).store(x * pb.index(i).load() + x.exp2()), arg=KernelInfo())
  ok = _check("elementwise a*b+exp2(a)", _run_kernel(dev, ew, (n * n, f32), [(a, f32), (b, f32)]),
              (a * b + np.exp2(a)).ravel(), 1e-5)
  rows = UOp.sink(param(0, n, f32).index(j).store(pa.index(j * n + k).load().reduce(k, arg=Ops.ADD)), arg=KernelInfo())
  ok &= _check("row sums", _run_kernel(dev, rows, (n, f32), [(a, f32)]), a.sum(1), 1e-5)
  r, c = UOp.range(n, 0), UOp.range(n, 1)
  kk = UOp.range(n, 2, AxisType.REDUCE)
  ha, hb = param(1, n * n, f16), param(2, n * n, f16)
  prod = ha.index(r * n + kk).load().cast(f32) * hb.index(kk * n + c).load().cast(f32)
  mm = UOp.sink(out.index(r * n + c).store(prod.reduce(kk, arg=Ops.ADD)), arg=KernelInfo())
  a16, b16 = a.astype(np.float16), b.astype(np.float16)
  ok &= _check("matmul fp16 (float acc)", _run_kernel(dev, mm, (n * n, f32), [(a16, f16), (b16, f16)]),
               (a16.astype(np.float32) @ b16.astype(np.float32)).ravel(), 1e-4)
  return bool(ok)


def tensor_checks(dev: str, mock: bool, quick: bool) -> bool:
  """tiny-tensor's conformance suite (ops, nn, copies, jit, graph) and its speed rows on `dev`, in a child process,
  when tiny-tensor is installed (this package never imports it). True when it passed or tiny-tensor is absent."""
  if importlib.util.find_spec("tiny_tensor") is None:
    print("  tiny-tensor is not installed: `pip install tiny-tensor`, then `python -m tiny_tensor.conformance "
          f"--device {dev} --speed` runs the tensor-level checks", flush=True)
    return True
  gemm, copy_mb, reps = (64, 1, 2) if mock else (1024, 64, 10) if quick else (4096, 1024, 20)
  cmd = [sys.executable, "-m", "tiny_tensor.conformance", "--device", dev, "--only", "ops,nn,copies,jit,graph",
         "--speed", "--gemm", str(gemm), "--copy-mb", str(copy_mb), "--reps", str(reps),
         *[f"--plugin={name}={target}" for name, target in {**DEVICES, "CPU": CPU_TARGET}.items()]]
  if not mock: cmd += ["--torch", "cuda"]
  return subprocess.run(cmd, check=False).returncode == 0


def main(argv: list[str]) -> int:
  mock, quick = "--mock" in argv, "--quick" in argv
  _register()
  st = time.perf_counter()
  if mock: devices = ["MOCK+CUDA", "MOCK+NV"]
  else:
    info, missing = probe()
    for line in info: print(line)
    cuda_ok = any(line.startswith("libcuda") for line in info) and not any(m.startswith("libcuda reports no")
                                                                          for m in missing)
    if not cuda_ok and not any(line.startswith("NV:") for line in info):
      print("no NVIDIA GPU usable here:\n  " + "\n  ".join(missing), file=sys.stderr)
      return 2
    devices = ["CUDA", "NV"]
  from tiny_uop.plugins import Device, DeviceUnavailableError
  ok = True
  for dev in devices:
    try: d = Device[dev]
    except DeviceUnavailableError as e:
      print(f"{dev}: unavailable: {e}")
      continue
    extra = f", driver {d.rm.version}, classes {d.compute_class:#x}/{d.dma_class:#x}" if hasattr(d, "rm") else ""
    print(f"{dev}: {getattr(d, 'name', '') or 'GPU'} arch {d.arch}{extra}", flush=True)
    ok &= kernels(dev, 32 if mock or quick else 256)
    ok &= tensor_checks(dev, mock, quick)
  print(f"selftest {'passed' if ok else 'FAILED'} in {time.perf_counter() - st:.1f}s")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
