"""Run tinygrad 0.14's QCOM driver on our mock KGSL and print what it computed, as one JSON line (test_qcom_proven.py
runs this in a subprocess: tinygrad's device registry, its DEV target and its FileIOInterface choice are process
globals that must not leak into other tests).

Who does what:
- tinygrad 0.14 (the wheel, unmodified): the Tensor front end, its scheduler and OpenCL C renderer (`QCOMCLRenderer`),
  and the whole driver: `ops_qcom.QCOMDevice` (opening /dev/kgsl-3d0, GPUOBJ_ALLOC + mmap, the draw context, the
  power constraint, the device info), `QCOMAllocator` (copies through the CPU mapping after a synchronize),
  `QCOMComputeQueue` (every type-4 / type-7 packet: register writes, CP_LOAD_STATE6_FRAG, CP_RUN_OPENCL, signals as
  CP_EVENT_WRITE CACHE_FLUSH_TS, waits as CP_WAIT_REG_MEM, barriers), `QCOMProgram` (parsing the Adreno program binary,
  loading its image, laying out the const file), `QCOMSignal` (KGSL timestamp waits), and `HCQGraph` (TinyJit replay).
- ours: the mock KGSL and its a630 (`tiny_runtime_qcom.mock`, reached through `test/mockgpu/mockgpu.py`), which runs
  the kernels on PoCL, and the compiler: tinygrad's `QCOMCompiler` runs Qualcomm's OpenCL compiler (libllvm-qcom on
  an aarch64 phone, or a downloaded aarch64 rootfs under qemu/docker), which this machine doesn't have, so it is
  replaced by the mock's compiler (`MockAdrenoCompiler`): tinygrad's OpenCL C, built by PoCL, in a program binary with
  the Adreno layout tinygrad's `_parse_lib` reads (the shader image carries the source the mock GPU runs).

Usage: `python run_tinygrad_qcom.py CASE...`; each case's result (or its error) is one key of the printed object.
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
os.environ.setdefault("DEV", "MOCK+QCOM")   # a MOCK interface: hcq.py's FileIOInterface becomes our adapter
os.environ.setdefault("PARALLEL", "0")      # compile in this process (the compiler swap below must apply)
os.environ.setdefault("CACHELEVEL", "0")    # no on-disk compile cache shared with other runs

import numpy as np  # noqa: E402

import tinygrad.runtime.support.compiler_qcom as compiler_qcom  # noqa: E402
from tinygrad.device import Compiler  # noqa: E402

from tiny_runtime_qcom import adreno  # noqa: E402
from tiny_runtime_qcom.mock.compiler import MockAdrenoCompiler  # noqa: E402
from tiny_runtime_qcom.mock.driver import driver  # noqa: E402


class OurQCOMCompiler(Compiler):
  """tinygrad's compiler interface over the mock's compiler: tinygrad's OpenCL C -> an Adreno-layout program binary
  (without tiny's container: tinygrad's QCOMProgram parses the bare binary)."""

  def __init__(self, arch: str):
    if arch.split(",")[0] != "a630": raise ValueError(f"the mock compiler builds for a630, not {arch!r}")
    self.ours = MockAdrenoCompiler(driver())
    super().__init__(f"tiny_mock_qcom_{arch}")

  def compile(self, src: str) -> bytes:
    """OpenCL C -> program binary."""
    return adreno.unpack_lib(self.ours.compile(src))[1]


compiler_qcom.QCOMCompiler = OurQCOMCompiler  # type: ignore[misc]  (QCOMCLRenderer imports it at construction)

from tinygrad import Device, Tensor, TinyJit  # noqa: E402
from test.mockgpu import mockgpu  # noqa: E402

RNG = np.random.default_rng(32)


def rand(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def counters() -> dict[str, int]:
  st = driver().cp.stats
  return {"dispatches": st["dispatches"], "submissions": st["submissions"], "packets": st["packets"]}


def case_device() -> dict[str, Any]:
  dev = Device["QCOM"]
  drv = driver()
  return {"gpu_id": list(dev.gpu_id), "arch": dev.arch, "fio": type(dev.fd).__name__, "ctx": dev.ctx,
          "mock_contexts": sorted(drv.contexts), "renderer": type(dev.renderer).__name__,
          "objects": len(drv.objs)}


def case_copy() -> dict[str, Any]:
  x = rand(3, 5)
  t = Tensor(x, device="QCOM").realize()
  buf = t.uop.buffer
  out = t.numpy()
  va = int(buf._buf.va_addr)
  drv = driver()
  in_gpu_object = any(s <= va < e for s, e in drv.ranges.items())
  return {"x": x.tolist(), "out": out.tolist(), "in_gpu_object": in_gpu_object}


def case_signals() -> dict[str, Any]:
  """A command buffer of tinygrad's own queue: wait on a signal the host set, a memory barrier, a timestamp, then
  signal two values; the host waits on each through tinygrad's QCOMSignal."""
  dev = Device["QCOM"]
  before = counters()
  start, done = dev.new_signal(value=5), dev.new_signal(value=0)
  q = dev.hw_compute_queue_t().wait(start, 5).memory_barrier().timestamp(done).signal(done, 7)
  q.signal(dev.timeline_signal, dev.next_timeline()).submit(dev)
  done.wait(7)
  dev.synchronize()
  after = counters()
  return {"done": done.value, "timestamp": float(done.timestamp), "timeline": dev.timeline_signal.value,
          "timeline_value": dev.timeline_value, "submissions": after["submissions"] - before["submissions"]}


def case_elementwise() -> dict[str, Any]:
  a, b, c = rand(4, 8), rand(4, 8), rand(4, 8)
  before = counters()
  out = (Tensor(a, device="QCOM") * Tensor(b, device="QCOM") + Tensor(c, device="QCOM").maximum(0)).numpy()
  return {"a": a.tolist(), "b": b.tolist(), "c": c.tolist(), "out": out.tolist(),
          "dispatches": counters()["dispatches"] - before["dispatches"]}


def case_reduce() -> dict[str, Any]:
  x = rand(6, 16)
  before = counters()
  t = Tensor(x, device="QCOM")
  s, m = t.sum(axis=1).numpy(), t.max(axis=0).numpy()
  return {"x": x.tolist(), "sum": s.tolist(), "max": m.tolist(),
          "dispatches": counters()["dispatches"] - before["dispatches"]}


def case_matmul() -> dict[str, Any]:
  a, b = rand(8, 12), rand(12, 4)
  before = counters()
  out = (Tensor(a, device="QCOM") @ Tensor(b, device="QCOM")).numpy()
  return {"a": a.tolist(), "b": b.tolist(), "out": out.tolist(),
          "dispatches": counters()["dispatches"] - before["dispatches"]}


def _jit_runs(n: int) -> list[dict[str, Any]]:
  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor: return ((a * b) + 1).contiguous().sum(axis=0).realize()

  runs, dev = [], Device["QCOM"]
  for _ in range(n):
    a, b = rand(8, 4), rand(8, 4)
    out = step(Tensor(a, device="QCOM"), Tensor(b, device="QCOM")).numpy()
    runs.append({"a": a.tolist(), "b": b.tolist(), "out": out.tolist(), "timeline": dev.timeline_value})
  del step
  gc.collect()
  return runs


def case_jit_nograph() -> dict[str, Any]:
  """TinyJit with JIT=2: captured kernels replayed one by one (tinygrad's eager QCOM launches), no HCQGraph."""
  from tinygrad.helpers import Context
  before = counters()
  with Context(JIT=2): runs = _jit_runs(4)
  return {"runs": runs, "dispatches": counters()["dispatches"] - before["dispatches"]}


def case_jit() -> dict[str, Any]:
  """TinyJit replayed through tinygrad's HCQGraph. Its kernargs buffer holds each kernel's slot of
  `kernargs_alloc_size` bytes (2048 + descriptors, rounded to 0x100) and no more, while QCOMComputeQueue.exec loads
  1024 // 4 vec4s (4096 bytes) of constants from the slot: the last kernel's load reads past the buffer. The mock
  faults there; the result says where, for the test to check against the graph's own buffer."""
  from tinygrad.engine.realize import graph_cache
  from tiny_runtime_qcom.mock.gpu import GPUFault
  # the GPU thread paused: submissions run at tinygrad's timeline waits (DEVICE_WAITTIMESTAMP_CTXTID), so the fault is
  # raised there, after the graph is built and cached, rather than in the thread at whichever ioctl comes next
  mockgpu.gpu_running.clear()
  try: runs, fault = _jit_runs(4), None
  except GPUFault as e: runs, fault = [], str(e)  # reported: the test asserts on it
  finally: mockgpu.gpu_running.set()
  graphs = [g for g in graph_cache.values() if type(g).__name__ == "HCQGraph"]
  bufs = [(int(b.va_addr), b.size) for g in graphs for b in g.kernargs_bufs.values()]
  slots = [(int(a.buf.va_addr), g.runtimes[j].kernargs_alloc_size) for g in graphs for j, a in g.ji_args.items()]
  return {"runs": runs, "fault": fault, "graphs": sorted({type(g).__name__ for g in graph_cache.values()}),
          "kernargs_bufs": bufs, "slot_sizes": slots}


CASES: dict[str, Callable[[], dict[str, Any]]] = {
  "device": case_device, "copy": case_copy, "signals": case_signals, "elementwise": case_elementwise,
  "reduce": case_reduce, "matmul": case_matmul, "jit_nograph": case_jit_nograph, "jit": case_jit}


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
  out["ioctls"] = sorted(set(mockgpu.ioctl_log))
  out["rejected"] = driver().cp.stats["rejected"] if driver()._cp is not None else 0
  print("PROVEN-RESULT " + json.dumps(out))
  sys.stdout.flush()


if __name__ == "__main__": main(sys.argv[1:] or list(CASES))
