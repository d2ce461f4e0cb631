"""The shared core of the GPU runtimes' hardware checks (`python -m tiny_runtime_amd.selftest`, `..._nv.selftest`,
`..._qcom.selftest`): each runtime describes its own part in a `SelfTest` (how to find its GPUs without opening them,
what its mock devices are, how a device describes itself) and calls `main(spec, argv)`, which runs the same steps:

1. the runtime's probe prints driver and GPU info; no usable GPU ends the run at once with exit status 2 and why;
2. on each device that opens, kernels built from UOps, compiled by the runtime's compiler (`SelfTest.get_program`,
   tiny-codegen's) and launched through the device API, against numpy: elementwise, a row sum, an fp16 matmul with
   float accumulation, and (`SelfTest.copy_round_trip`) a host -> device -> host copy;
3. when tiny-tensor is installed, its conformance suite on the device in a child process (this process never
   imports tiny-tensor).

Exit status 0 when every check passed, 1 when one failed (or numpy, the reference, is missing), 2 when there is no
GPU. Arguments: `--mock` (the runtime's mock devices, small sizes), `--quick` (smaller sizes), `--no-tensor` (skip
step 3). This module imports only the standard library; numpy is imported when the checks run (the runtimes whose
package does not depend on numpy get a clear message and exit status 1 without it).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING: import numpy as np

CPU_TARGET = "tiny_runtime_cpu.cpu:CPUDevice"  # for the conformance suite's copies to and from the host device


@dataclass(frozen=True)
class SelfTest:
  """One runtime's part of its selftest; `main` does the rest."""
  gpu: str  # what is missing when there is none, as in "no AMD GPU usable here"
  devices: dict[str, str]  # device name -> "module:Class", registered for a bare source tree and passed to the suite
  probe: Callable[[], tuple[list[str], list[str], list[str]]]  # (info lines, why no GPU, devices); no device opened
  mock_devices: Callable[[], list[str]]  # the devices `--mock` runs on
  describe: Callable[[str, Any], str]  # (name, opened device) -> its one-line description
  get_program: Callable[[Any, Any], Any]  # (kernel AST, renderer) -> ProgramSpec: tiny-codegen's get_program
  sizes: tuple[int, int, int] = (16, 64, 256)  # the kernels' n (n x n inputs) for --mock, --quick, a full run
  mock_gemm: int = 32  # the conformance suite's GEMM size under --mock
  interfaces: tuple[str, ...] = ("MOCK",)  # the DevicePlugin interfaces of `devices`
  copy_round_trip: bool = True  # step 2 ends with a host -> device -> host copy
  unavailable_fails: bool = True  # a device that does not open fails the run (False: it is only reported)
  torch: str | None = None  # the torch device the suite's speed rows compare against on hardware ("cuda")


def register(spec: SelfTest) -> None:
  """Make the runtime's devices known without installed entry points (a bare source tree on PYTHONPATH)."""
  from tiny_uop.plugins import DevicePlugin, register_device
  for name, target in spec.devices.items():
    register_device(DevicePlugin(name, target, priority=25, interfaces=spec.interfaces))


def check(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> bool:
  """Print one result row: `got` against the reference `want`, relative max error within `tol`."""
  import numpy as np
  err = float(np.max(np.abs(got.astype(np.float64) - want)) / (np.max(np.abs(want)) + 1e-9)) if want.size else 0.0
  ok = bool(np.isfinite(err) and err <= tol)
  print(f"  {'ok  ' if ok else 'FAIL'} {name:28s} rel err {err:.2e} (tol {tol:g})", flush=True)
  return ok


def run_kernel(spec: SelfTest, dev: str, ast: Any, out: tuple[int, Any],
               ins: list[tuple[np.ndarray, Any]]) -> np.ndarray:
  """Compile kernel `ast` (slot 0 = the output of `out` = (size, dtype), then `ins`) with `spec.get_program`, run it on
  `dev` through the device API (no tiny-tensor) and return the output."""
  import numpy as np
  from tiny_uop.device import Buffer
  from tiny_uop.plugins import Device
  d = Device[dev]
  prog = spec.get_program(ast, d.renderer)
  bufs = [Buffer(dev, out[0], out[1]).allocate()]
  bufs += [Buffer(dev, a.size, dt).copyin(memoryview(np.ascontiguousarray(a).tobytes())) for a, dt in ins]
  d.get_program(prog.name, prog.lib)(*[bufs[g]._buf for g in prog.globals], global_size=prog.global_size,
                                     local_size=prog.local_size, vals=(), wait=True)
  return bufs[0].numpy()


def kernels(spec: SelfTest, dev: str, n: int) -> bool:
  """Kernels built from UOps, compiled and launched through the device API, against numpy: an elementwise kernel, a
  row sum, an fp16 matmul with float accumulation (tensor cores where the optimizer picks them); then, when
  `spec.copy_round_trip`, a copy round trip."""
  import numpy as np
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
  ok = check("elementwise a*b+exp2(a)", run_kernel(spec, dev, ew, (n * n, f32), [(a, f32), (b, f32)]),
             (a * b + np.exp2(a)).ravel(), 1e-5)
  rows = UOp.sink(param(0, n, f32).index(j).store(pa.index(j * n + k).load().reduce(k, arg=Ops.ADD)), arg=KernelInfo())
  ok &= check("row sums", run_kernel(spec, dev, rows, (n, f32), [(a, f32)]), a.sum(1), 1e-5)
  r, c = UOp.range(n, 0), UOp.range(n, 1)
  kk = UOp.range(n, 2, AxisType.REDUCE)
  ha, hb = param(1, n * n, f16), param(2, n * n, f16)
  prod = ha.index(r * n + kk).load().cast(f32) * hb.index(kk * n + c).load().cast(f32)
  mm = UOp.sink(out.index(r * n + c).store(prod.reduce(kk, arg=Ops.ADD)), arg=KernelInfo())
  a16, b16 = a.astype(np.float16), b.astype(np.float16)
  ok &= check("matmul fp16 (float acc)", run_kernel(spec, dev, mm, (n * n, f32), [(a16, f16), (b16, f16)]),
              (a16.astype(np.float32) @ b16.astype(np.float32)).ravel(), 1e-4)
  if spec.copy_round_trip:
    big = rng.standard_normal(n * n * 16).astype(np.float32)
    back = Buffer(dev, big.size, f32).copyin(memoryview(big.tobytes())).numpy()
    ok &= check("copy host->device->host", back, big, 0.0)
  return bool(ok)


def tensor_checks(spec: SelfTest, dev: str, mock: bool, quick: bool) -> bool:
  """tiny-tensor's conformance suite (ops, nn, copies, jit, graph) and its speed rows on `dev`, in a child process,
  when tiny-tensor is installed (never imported here). True when it passed or tiny-tensor is absent."""
  if importlib.util.find_spec("tiny_tensor") is None:
    print("  tiny-tensor is not installed: `pip install tiny-tensor`, then `python -m tiny_tensor.conformance "
          f"--device {dev} --speed` runs the tensor-level checks", flush=True)
    return True
  gemm, copy_mb, reps = (spec.mock_gemm, 1, 2) if mock else (1024, 64, 10) if quick else (4096, 1024, 20)
  cmd = [sys.executable, "-m", "tiny_tensor.conformance", "--device", dev, "--only", "ops,nn,copies,jit,graph",
         "--speed", "--gemm", str(gemm), "--copy-mb", str(copy_mb), "--reps", str(reps),
         *[f"--plugin={name}={target}" for name, target in {**spec.devices, "CPU": CPU_TARGET}.items()]]
  if spec.torch is not None and not mock: cmd += ["--torch", spec.torch]
  return subprocess.run(cmd, check=False).returncode == 0


def main(spec: SelfTest, argv: list[str]) -> int:
  """Run the checks (see the module docstring) for the runtime `spec` describes; the exit status (0, 1 or 2)."""
  mock, quick, tensor = "--mock" in argv, "--quick" in argv, "--no-tensor" not in argv
  if importlib.util.find_spec("numpy") is None:
    print("the selftest compares kernels against numpy, which is not installed: pip install numpy", file=sys.stderr)
    return 1
  register(spec)
  st = time.perf_counter()
  if mock: devices = spec.mock_devices()
  else:
    info, missing, devices = spec.probe()
    for line in info: print(line)
    if not devices:
      print(f"no {spec.gpu} usable here:\n  " + "\n  ".join(missing), file=sys.stderr)
      return 2
  from tiny_uop.plugins import Device, DeviceUnavailableError
  ok = True
  for dev in devices:
    try: d = Device[dev]
    except DeviceUnavailableError as e:
      print(f"{dev}: unavailable: {e}")
      ok &= not spec.unavailable_fails
      continue
    print(f"{dev}: {spec.describe(dev, d)}", flush=True)
    ok &= kernels(spec, dev, spec.sizes[0] if mock else spec.sizes[1] if quick else spec.sizes[2])
    if tensor: ok &= tensor_checks(spec, dev, mock, quick)
  print(f"selftest {'passed' if ok else 'FAILED'} in {time.perf_counter() - st:.1f}s")
  return 0 if ok else 1
