"""Hardware check for a machine with an AMD GPU: `python -m tiny_runtime_amd.selftest` (from the source tree:
`PYTHONPATH=packages/tiny-uop:packages/tiny-codegen:packages/tiny-runtime-cpu:packages/tiny-runtime-amd:`
`packages/tiny-tensor python -m tiny_runtime_amd.selftest`; this process never imports tiny-tensor).

1. driver and GPU info: /dev/kfd, and every GPU node of the KFD topology (LLVM target, CUs, XCCs, render node);
2. on each AMD device that opens (`AMD:n`; one that can't open says why): kernels built from UOps by tiny-codegen,
   compiled for the GPU's target and launched through the device API, against numpy (elementwise, a row reduction, an
   fp16 matmul with float accumulation), and a host -> device -> host copy through the SDMA queue;
3. when tiny-tensor is installed, its conformance suite on the device in a child process (`python -m
   tiny_tensor.conformance --device AMD --speed ...`), next to torch on cuda (ROCm's torch) when installed.
Exit status 0 when every check passed, 1 when one failed, 2 when there is no AMD GPU (said at once, with why).
`--mock` runs steps 2-3 on MOCK+AMD (gfx1100, the RDNA3 emulator; with `DEV=MOCK+AMD:LLVM:gfx942`, the mocked MI300
and the CDNA3 emulator: the arch is a process-wide choice) with small sizes (what the unit test does); `--quick`
shrinks the sizes; `--no-tensor` skips step 3. Compiling needs LLVM's AMDGPU backend (llvmlite) and ld.lld.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

DEVICES = {"AMD": "tiny_runtime_amd.device:AMDDevice"}  # MOCK+AMD too
CPU_TARGET = "tiny_runtime_cpu.cpu:CPUDevice"  # for the conformance suite's copies to and from the host device


def _register() -> None:
  """Make AMD known without installed entry points (a bare source tree on PYTHONPATH)."""
  from tiny_uop.plugins import DevicePlugin, register_device
  for name, target in DEVICES.items(): register_device(DevicePlugin(name, target, priority=25, interfaces=("MOCK",)))


def probe() -> tuple[list[str], list[str], int]:
  """(info lines, reasons there is no usable AMD GPU, number of GPU nodes) without opening a device."""
  from tiny_runtime_amd import kfd
  from tiny_uop.hcq import FileIOInterface
  info, missing = [], []
  if not FileIOInterface.exists(kfd.KFD_PATH):
    missing.append(f"{kfd.KFD_PATH} missing (the amdgpu kernel driver with KFD is not loaded)")
    return info, missing, 0
  info.append(f"KFD: {kfd.KFD_PATH} present")
  nodes = kfd.gpu_nodes()
  for n in nodes:
    info.append(f"  node {n.node}: {n.arch}, {n.cu_count} CUs, {n.num_xcc} XCC(s), gpu_id {n.gpu_id:#x}, "
                f"render node /dev/dri/renderD{n.drm_render_minor}")
  if not nodes: missing.append(f"the KFD topology ({kfd.TOPOLOGY}) lists no GPU node")
  return info, missing, len(nodes)


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
  elementwise kernel, a row sum, an fp16 matmul with float accumulation; then a copy round trip."""
  from tiny_uop.device import Buffer
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
  big = rng.standard_normal(n * n * 16).astype(np.float32)
  ok &= _check("copy host->device->host", Buffer(dev, big.size, f32).copyin(memoryview(big)).numpy(), big, 0.0)
  return bool(ok)


def tensor_checks(dev: str, mock: bool, quick: bool) -> bool:
  """tiny-tensor's conformance suite (ops, nn, copies, jit, graph) and its speed rows on `dev`, in a child process,
  when tiny-tensor is installed (this package never imports it). True when it passed or tiny-tensor is absent."""
  if importlib.util.find_spec("tiny_tensor") is None:
    print("  tiny-tensor is not installed: `pip install tiny-tensor`, then `python -m tiny_tensor.conformance "
          f"--device {dev} --speed` runs the tensor-level checks", flush=True)
    return True
  gemm, copy_mb, reps = (32, 1, 2) if mock else (1024, 64, 10) if quick else (4096, 1024, 20)
  cmd = [sys.executable, "-m", "tiny_tensor.conformance", "--device", dev, "--only", "ops,nn,copies,jit,graph",
         "--speed", "--gemm", str(gemm), "--copy-mb", str(copy_mb), "--reps", str(reps),
         *[f"--plugin={name}={target}" for name, target in {**DEVICES, "CPU": CPU_TARGET}.items()]]
  if not mock: cmd += ["--torch", "cuda"]
  return subprocess.run(cmd, check=False).returncode == 0


def main(argv: list[str]) -> int:
  """Run the checks (see the module docstring); the exit status."""
  mock, quick, tensor = "--mock" in argv, "--quick" in argv, "--no-tensor" not in argv
  _register()
  st = time.perf_counter()
  if mock:  # DEV picks the mocked GPUs' arch for the whole process (MOCK+AMD:LLVM:gfx942: MI300s)
    dev_env = os.environ.get("DEV", "")
    devices = [dev_env if dev_env.startswith("MOCK+AMD") else "MOCK+AMD"]
  else:
    info, missing, n = probe()
    for line in info: print(line)
    if missing:
      print("no AMD GPU usable here:\n  " + "\n  ".join(missing), file=sys.stderr)
      return 2
    devices = [f"AMD:{i}" for i in range(n)]
  from tiny_uop.plugins import Device, DeviceUnavailableError
  ok = True
  for dev in devices:
    try: d = Device[dev]
    except DeviceUnavailableError as e:
      print(f"{dev}: unavailable: {e}")
      ok = False
      continue
    node = d.iface.node
    print(f"{dev}: {node.arch}, {node.cu_count} CUs, {node.num_xcc} XCC(s), wave{d.wave_size}", flush=True)
    ok &= kernels(dev, 16 if mock else 64 if quick else 256)
    if tensor: ok &= tensor_checks(dev, mock, quick)
  print(f"selftest {'passed' if ok else 'FAILED'} in {time.perf_counter() - st:.1f}s")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
