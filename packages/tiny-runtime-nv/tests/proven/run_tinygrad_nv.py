"""Run tinygrad 0.14's own NV driver on tiny-runtime-nv's mock RM/UVM driver and print what it computed as JSON.

Started by `tests/test_nv_proven.py` in a subprocess (tinygrad's device registry and DEV are process globals) with
DEV=MOCK:2+NV:PTX and this folder on sys.path, so that tinygrad's hcq.py takes `test.mockgpu.mockgpu.
MockFileIOInterface` as its file interface and opens mock GPU 2 (a GA102: AMPERE_COMPUTE_B, the class tinygrad's driver
picks) with its MOCK interface. Everything from the Tensor down to the GPFIFO entries, QMDs and doorbell writes is
tinygrad's (its PTX renderer and MOCK-interface compiler, whose binary is the PTX text itself; NVDevice, NVAllocator,
NVProgram, NVComputeQueue/NVCopyQueue, HCQGraph); the RM/UVM answers, the GPU that decodes those methods and the PTX
executor that runs the kernels are ours. The inputs are printed too, so that the test computes its numpy reference
from them.
"""
from __future__ import annotations

import json
import sys

import numpy as np


def main() -> None:
  """Open the device, run the op set, print one JSON object with inputs, outputs and driver facts."""
  from tinygrad import Device, Tensor, TinyJit
  import tinygrad.runtime.graph.hcq as hcq_graph
  from test.mockgpu import mockgpu

  out: dict = {}
  rng = np.random.default_rng(32)
  dev = Device["NV"]
  iface = dev.iface
  out["open"] = {"device": dev.device, "arch": dev.arch, "iface": type(iface).__name__,
                 "compute_class": iface.compute_class, "dma_class": iface.dma_class,
                 "gpfifo_class": iface.gpfifo_class, "usermode_class": iface.usermode_class,
                 "gr": [dev.num_gpcs, dev.num_tpc_per_gpc, dev.num_sm_per_tpc, dev.max_warps_per_sm],
                 "tokens": [dev.compute_gpfifo.token, dev.dma_gpfifo.token],
                 "timeline": dev.timeline_value,
                 "ioctls": [[p, req] for p, req, _ in mockgpu.IOCTL_LOG]}

  # allocator round trip: tinygrad's NVAllocator, its copy queue (LAUNCH_DMA through staging buffers)
  data = rng.integers(0, 256, size=3 * 4096 + 100, dtype=np.uint8)
  buf = dev.allocator.alloc(data.nbytes)
  dev.allocator._copyin(buf, memoryview(data))
  back = np.empty_like(data)
  dev.allocator._copyout(memoryview(back), buf)
  dev.allocator.free(buf, data.nbytes)
  out["copy"] = {"in": data.tolist(), "out": back.tolist()}

  a = rng.standard_normal((6, 10)).astype(np.float32)
  b = rng.standard_normal((6, 10)).astype(np.float32)
  out["elementwise"] = {"a": a.tolist(), "b": b.tolist(),
                        "out": ((Tensor(a) * Tensor(b) + 1).exp2().numpy()).tolist()}
  out["reduction"] = {"a": a.tolist(), "sum1": Tensor(a).sum(axis=1).numpy().tolist(),
                      "max": float(Tensor(a).max().numpy())}
  m1 = rng.standard_normal((8, 12)).astype(np.float32)
  m2 = rng.standard_normal((12, 5)).astype(np.float32)
  out["matmul"] = {"a": m1.tolist(), "b": m2.tolist(), "out": (Tensor(m1) @ Tensor(m2)).numpy().tolist()}

  # TinyJit replay: two kernels per call, so tinygrad batches them into one HCQGraph and replays it
  calls = {"graphs": 0, "replays": 0}
  init, call = hcq_graph.HCQGraph.__init__, hcq_graph.HCQGraph.__call__

  def counted_init(self, *args, **kwargs):
    calls["graphs"] += 1
    init(self, *args, **kwargs)

  def counted_call(self, *args, **kwargs):
    calls["replays"] += 1
    return call(self, *args, **kwargs)

  hcq_graph.HCQGraph.__init__, hcq_graph.HCQGraph.__call__ = counted_init, counted_call

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    h = (x * y + 1).relu().realize()
    return (h * 2 - x).contiguous().realize()

  runs = []
  for _ in range(5):
    x = rng.standard_normal(40).astype(np.float32)
    y = rng.standard_normal(40).astype(np.float32)
    before = dev.timeline_value
    r = step(Tensor(x), Tensor(y)).numpy()
    runs.append({"x": x.tolist(), "y": y.tolist(), "out": r.tolist(), "timeline": [before, dev.timeline_value]})
  out["replay"] = {"runs": runs, **calls}
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
