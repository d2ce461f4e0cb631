"""Hardware check for a machine with an NVIDIA GPU: `python -m tiny_runtime_nv.selftest` (from the source tree:
`PYTHONPATH=packages/tiny-uop:packages/tiny-codegen:packages/tiny-runtime-cpu:packages/tiny-runtime-nv:`
`packages/tiny-tensor python -m tiny_runtime_nv.selftest`; needs numpy and cffi only, imports no llvmlite).

1. driver and GPU info (libcuda: driver version and devices; the NV device: the RM driver version, GPU, classes);
2. a correctness set on each NVIDIA device that opens (`CUDA` through libcuda, `NV` through the RM ioctls; one that
   can't open says why) against numpy:
   elementwise, reductions, fp32/fp16/bf16 matmuls (tensor cores), a conv, softmax, copies, TinyJit replay;
3. speed: fp16/bf16 GEMM TFLOPS, device copy GB/s and TinyJit replay µs (host), next to torch when installed.
Exit status 0 when every check passed, 1 when one failed, 2 when there is no NVIDIA GPU (said at once, with why).
`--mock` runs steps 2-3 on MOCK+CUDA and MOCK+NV with small sizes (what the unit test does); `--quick` shrinks the
sizes. The NV device builds cubins with NVIDIA's ptxas (PTXAS=..., a CUDA toolkit, the nvidia-cuda-nvcc wheel) or
libcuda's JIT.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

DEVICES = {"CUDA": "tiny_runtime_nv.cuda:CUDADevice", "NV": "tiny_runtime_nv.device:NVDevice"}  # MOCK+ too


def _register() -> None:
  """Make CUDA/NV/CPU known without installed entry points (a bare source tree on PYTHONPATH)."""
  from tiny_uop.plugins import DevicePlugin, register_device
  from tiny_uop.plugins import DevicePlugin as _  # noqa: F401
  for name, target in {**DEVICES, "CPU": "tiny_runtime_cpu.cpu:CPUDevice"}.items():
    register_device(DevicePlugin(name, target, priority=25 if name != "CPU" else 90))


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


def correctness(dev: str, n: int) -> bool:
  """The correctness set on device `dev` (matrix size `n`)."""
  from tiny_tensor import Tensor, TinyJit, dtypes
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  ok = _check("elementwise", (ta * tb + ta.exp2()).numpy(), a * b + np.exp2(a), 1e-5)
  ok &= _check("sum / max", np.array([ta.sum().item(), ta.max().item()]), np.array([a.sum(), a.max()]), 1e-4)
  ok &= _check("matmul fp32", (ta @ tb).numpy(), a @ b, 1e-4)
  for dt, npdt in ((dtypes.float16, np.float16), (dtypes.bfloat16, None)):
    ref = a.astype(npdt).astype(np.float32) if npdt else (a.view(np.uint32) & 0xFFFF0000).view(np.float32)
    refb = b.astype(npdt).astype(np.float32) if npdt else (b.view(np.uint32) & 0xFFFF0000).view(np.float32)
    got = (ta.cast(dt) @ tb.cast(dt)).cast(dtypes.float32).numpy()
    ok &= _check(f"matmul {dt.name} (tensor cores)", got, ref @ refb, 2e-2)
  x, w = rng.standard_normal((2, 3, 16, 16)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  want = np.zeros((2, 4, 14, 14), np.float32)
  for i in range(3):
    for j in range(3): want += np.einsum("bchw,oc->bohw", x[:, :, i:i + 14, j:j + 14], w[:, :, i, j])
  ok &= _check("conv2d 3x3", Tensor(x, device=dev).conv2d(Tensor(w, device=dev)).numpy(), want, 1e-4)
  e = np.exp(a - a.max(1, keepdims=True))
  ok &= _check("softmax", ta.softmax(1).numpy(), e / e.sum(1, keepdims=True), 1e-5)
  ok &= _check("copy to device and back", Tensor(a, device=dev).contiguous().numpy(), a, 0)
  f = TinyJit(lambda x, y: (x * 2 + y).realize())
  for i in range(4):
    xs, ys = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    got = f(Tensor(xs, device=dev), Tensor(ys, device=dev)).numpy()
    ok &= _check(f"TinyJit replay {i}", got, xs * 2 + ys, 1e-6) if i == 3 else bool(np.allclose(got, xs * 2 + ys))
  return bool(ok)


def _timeit(fn: Callable[[], Any], sync: Callable[[], None], reps: int) -> float:
  fn()
  sync()
  st = time.perf_counter()
  for _ in range(reps): fn()
  sync()
  return (time.perf_counter() - st) / reps


def speed(dev: str, n: int, copy_mb: int, reps: int) -> None:
  """GEMM TFLOPS, copy GB/s and TinyJit replay µs on `dev`, and torch's on cuda when it is installed."""
  from tiny_tensor import Tensor, TinyJit, dtypes
  from tiny_uop.plugins import Device
  d = Device[dev]
  rows: dict[str, dict[str, float]] = {}
  for dt in (dtypes.float16, dtypes.bfloat16):
    a, b = Tensor.rand(n, n, device=dev).cast(dt).realize(), Tensor.rand(n, n, device=dev).cast(dt).realize()
    mm = TinyJit(lambda a, b: (a @ b).realize())
    t = _timeit(lambda mm=mm, a=a, b=b: mm(a, b), d.synchronize, reps)
    rows[f"GEMM {n}^3 {dt.name} TFLOPS"] = {"tiny": 2 * n ** 3 / t / 1e12}
  src = Tensor.rand(copy_mb << 18, device=dev).realize()
  cp = TinyJit(lambda s: (s + 0).realize())
  rows[f"copy {copy_mb} MB GB/s (read+write)"] = {"tiny": 2 * src.nbytes() / _timeit(lambda: cp(src), d.synchronize,
                                                                                        reps) / 1e9}
  x = Tensor.rand(16, device=dev).realize()
  f = TinyJit(lambda x: (x + 1).realize())
  for _ in range(3): f(x)
  d.synchronize()
  st = time.perf_counter()
  for _ in range(100): f(x)
  rows["TinyJit replay host us"] = {"tiny": (time.perf_counter() - st) / 100 * 1e6}
  d.synchronize()
  _torch(rows, n, copy_mb, reps)
  for k, r in rows.items(): print(f"  {k:34s} " + "  ".join(f"{impl}={v:,.2f}" for impl, v in r.items()), flush=True)


def _torch(rows: dict[str, dict[str, float]], n: int, copy_mb: int, reps: int) -> None:
  try:
    import torch  # type: ignore[import-not-found]
  except ImportError: return
  if not torch.cuda.is_available(): return
  sync = torch.cuda.synchronize
  for dt, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
    a, b = torch.rand(n, n, device="cuda", dtype=dt), torch.rand(n, n, device="cuda", dtype=dt)
    rows[f"GEMM {n}^3 {name} TFLOPS"]["torch"] = 2 * n ** 3 / _timeit(lambda a=a, b=b: a @ b, sync, reps) / 1e12
  s = torch.rand(copy_mb << 18, device="cuda")
  rows[f"copy {copy_mb} MB GB/s (read+write)"]["torch"] = 2 * s.numel() * 4 / _timeit(lambda: s + 0, sync, reps) / 1e9


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
    ok &= correctness(dev, 32 if mock or quick else 256)
    speed(dev, *((64, 1, 2) if mock else (1024, 64, 10) if quick else (4096, 1024, 20)))
  print(f"selftest {'passed' if ok else 'FAILED'} in {time.perf_counter() - st:.1f}s")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
