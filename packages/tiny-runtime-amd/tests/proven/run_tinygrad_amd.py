"""Run tinygrad 0.14's AMD driver on our mock KFD and print what it computed, as one JSON line (test_amd_proven.py
runs this in a subprocess: tinygrad's device registry, its DEV target and its FileIOInterface choice are process
globals that must not leak into other tests).

Who does what:
- tinygrad 0.14 (the wheel, unmodified): the Tensor front end, its scheduler and AMD LLVM IR renderer
  (`AMDLLVMRenderer`), and the whole driver: `ops_amd.KFDIface` (topology walk, ACQUIRE_VM, allocations and
  mappings, event page and events, queue creation, doorbells), `AMDComputeQueue` / `AMDCopyQueue` (every PM4 and SDMA
  packet), `AMDProgram` (code object load, kernargs, dispatch registers), `AMDSignal`, and `HCQGraph` (TinyJit replay).
- ours: the mock KFD and its GPUs (`tiny_runtime_amd.mock`, reached through `test/mockgpu/mockgpu.py`), the RDNA3
  emulator that runs the kernels, and the compiler: tinygrad compiles AMD LLVM IR with libLLVM through ctypes (comgr
  /ROCm LLVM, which CI lacks), so `AMDLLVMCompiler` is replaced by tiny-codegen's `AMDGPUCompiler` (llvmlite's AMDGPU
  backend + our code object linker). The LLVM IR it compiles is tinygrad's.

Usage: `python run_tinygrad_amd.py CASE...`; each case's result (or its error) is one key of the printed object.
"""
from __future__ import annotations

import gc
import json
import os
import pathlib
import sys
import traceback
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the `test.mockgpu.mockgpu` package tinygrad imports under a MOCK interface
os.environ.setdefault("DEV", "MOCKKFD+AMD:LLVM")  # the KFD interface's mock variant; the LLVM renderer
os.environ.setdefault("PARALLEL", "0")            # compile in this process (the compiler swap below must apply)
os.environ.setdefault("CACHELEVEL", "0")          # no on-disk compile cache shared with other runs

import numpy as np  # noqa: E402

import tinygrad.runtime.support.compiler_llvm as compiler_llvm  # noqa: E402
from tinygrad.device import Compiler  # noqa: E402

from tiny_codegen.compiler.amdgpu import AMDGPUCompiler  # noqa: E402


class OurAMDCompiler(Compiler):
  """tinygrad's compiler interface over tiny-codegen's AMDGPU compiler: tinygrad's LLVM IR -> our code object."""

  def __init__(self, arch: str):
    self.ours = AMDGPUCompiler(arch.split(":")[0])
    super().__init__(f"tiny_amdgpu_{arch}")

  def compile(self, src: str) -> bytes:
    """LLVM IR text -> HSA code object."""
    return self.ours.compile(src)


compiler_llvm.AMDLLVMCompiler = OurAMDCompiler  # type: ignore[misc]  (AMDLLVMRenderer looks it up at construction)

from tinygrad import Device, Tensor, TinyJit  # noqa: E402
from test.mockgpu import mockgpu  # noqa: E402

RNG = np.random.default_rng(32)


def rand(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def driver() -> Any: return mockgpu.kfd()


def counters() -> dict[str, int]:
  g = driver().gpus[0]
  return {"dispatches": g.dispatches, "copies": g.copies}


def case_device() -> dict[str, Any]:
  dev = Device["AMD"]
  drv = driver()
  return {"arch": dev.arch, "iface": type(dev.iface).__name__, "gpu_id": dev.iface.gpu_id,
          "mock_gpu_ids": [g.gpu_id for g in drv.gpus], "props_simd": dev.iface.props["simd_count"],
          "mock_simd": drv.gpus[0].props["simd_count"], "ip_versions": {str(k): v for k, v in
                                                                        dev.iface.ip_versions.items()},
          "queues": sorted((q.kind, q.gpu.gpu_id) for q in drv.queues.values()),
          "has_sdma": dev.has_sdma_queue, "aql": bool(dev.is_aql)}


def case_copy() -> dict[str, Any]:
  x = rand(3, 5)
  before = counters()
  t = Tensor(x, device="AMD").realize()
  out = t.numpy()
  return {"x": x.tolist(), "out": out.tolist(), "copies": counters()["copies"] - before["copies"]}


def case_elementwise() -> dict[str, Any]:
  a, b, c = rand(4, 8), rand(4, 8), rand(4, 8)
  before = counters()
  out = (Tensor(a, device="AMD") * Tensor(b, device="AMD") + Tensor(c, device="AMD").maximum(0)).numpy()
  return {"a": a.tolist(), "b": b.tolist(), "c": c.tolist(), "out": out.tolist(),
          "dispatches": counters()["dispatches"] - before["dispatches"]}


def case_reduce() -> dict[str, Any]:
  x = rand(6, 16)
  before = counters()
  t = Tensor(x, device="AMD")
  s, m = t.sum(axis=1).numpy(), t.max(axis=0).numpy()
  return {"x": x.tolist(), "sum": s.tolist(), "max": m.tolist(),
          "dispatches": counters()["dispatches"] - before["dispatches"]}


def case_matmul() -> dict[str, Any]:
  a, b = rand(8, 12), rand(12, 4)
  before = counters()
  out = (Tensor(a, device="AMD") @ Tensor(b, device="AMD")).numpy()
  return {"a": a.tolist(), "b": b.tolist(), "out": out.tolist(),
          "dispatches": counters()["dispatches"] - before["dispatches"]}


def case_jit() -> dict[str, Any]:
  from tinygrad.engine.realize import graph_cache

  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor: return ((a * b) + 1).contiguous().sum(axis=0).realize()

  runs = []
  dev = Device["AMD"]
  for _ in range(4):
    a, b = rand(8, 4), rand(8, 4)
    out = step(Tensor(a, device="AMD"), Tensor(b, device="AMD")).numpy()
    runs.append({"a": a.tolist(), "b": b.tolist(), "out": out.tolist(), "timeline": dev.timeline_value})
  graphs = sorted({type(v).__name__ for v in graph_cache.values()})
  del step
  gc.collect()
  return {"runs": runs, "graphs": graphs, "dispatches": counters()["dispatches"]}


CASES: dict[str, Callable[[], dict[str, Any]]] = {
  "device": case_device, "copy": case_copy, "elementwise": case_elementwise, "reduce": case_reduce,
  "matmul": case_matmul, "jit": case_jit}


def main(names: list[str]) -> None:
  """Run the named cases in order; print {case: result or {"error": traceback}} and the mock's state."""
  unknown = [n for n in names if n not in CASES]
  if unknown: raise SystemExit(f"unknown cases {unknown}; valid: {sorted(CASES)}")
  out: dict[str, Any] = {}
  for name in names:
    try: out[name] = CASES[name]()
    except Exception:  # noqa: BLE001  (reported per case: the test prints it and fails that case)
      out[name] = {"error": traceback.format_exc()}
  out["gpu_errors"] = [repr(e) for e in mockgpu.gpu_errors]
  out["ioctls"] = sorted({f"{p}:{r:#x}" for p, r in mockgpu.ioctl_log})
  print("PROVEN-RESULT " + json.dumps(out))
  sys.stdout.flush()


if __name__ == "__main__": main(sys.argv[1:] or list(CASES))
