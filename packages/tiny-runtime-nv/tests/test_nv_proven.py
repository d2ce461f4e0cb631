"""tinygrad 0.14's proven NV driver on our mock RM/UVM driver and mock GPU (issue #32).

tinygrad's `runtime/support/hcq.py` takes its file interface from `test.mockgpu.mockgpu.MockFileIOInterface` when
DEV's interface starts with MOCK; `tests/proven/test/mockgpu/mockgpu.py` is that module, routing tinygrad's opens,
ioctls (its ctypes RM escape and UVM parameter structs) and mmaps to `tiny_runtime_nv.mock.rm`. The subprocess
(`tests/proven/run_tinygrad_nv.py`, one per test module so tinygrad's globals stay out of this process) runs with
DEV=MOCK:2+NV:PTX: mock GPU 2, a GA102 whose AMPERE_COMPUTE_B tinygrad's driver selects.

Which half is whose: tinygrad's are the renderer (PTXRenderer) and compiler of its MOCK interface, whose binary is the
PTX text itself (ops_nv.py: "For MOCKGPU, the lib is PTX code"), the driver (NVDevice/NVKIface: RM objects, UVM
ranges, GPFIFO channels), the allocator, the queues and every packet (host semaphores, copy-engine LAUNCH_DMA, QMDs
with chained DEPENDENT_QMD0 and release semaphores, doorbells) and HCQGraph. Ours are the answers to each ioctl, the
GPU that decodes those methods and QMDs, and the PTX executor that runs tinygrad's kernels. Each result is checked
against numpy computed here from the inputs the subprocess used.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROVEN = Path(__file__).parent / "proven"
# tinygrad's classes (nv_580.py / cl*.h): what it must pick on a GA102
AMPERE_COMPUTE_B, AMPERE_DMA_COPY_B, AMPERE_CHANNEL_GPFIFO_A, TURING_USERMODE_A = 0xC7C0, 0xC7B5, 0xC56F, 0xC461


@pytest.fixture(scope="module")
def run() -> dict:
  """tinygrad's NV driver on the mock, once per module, in a subprocess; its JSON report."""
  env = {**os.environ, "DEV": "MOCK:2+NV:PTX",
         "PYTHONPATH": os.pathsep.join([str(PROVEN), *sys.path])}
  p = subprocess.run([sys.executable, str(PROVEN / "run_tinygrad_nv.py")], capture_output=True, text=True, env=env,
                     timeout=600, cwd=str(PROVEN))
  assert p.returncode == 0, f"tinygrad's NV driver on the mock failed:\n{p.stderr[-6000:]}"
  return json.loads(p.stdout)


def test_device_open(run):
  """tinygrad's NVDevice opens mock GPU 2 through its MOCK interface: the GA102's classes, sm_86, the GR facts, two
  channels with distinct work-submit tokens, and its setup queues completed (timeline advanced). The ioctl stream
  starts the way RM requires: /dev/nvidiactl's root client before UVM_INITIALIZE, NV_ESC_CARD_INFO on the control
  file, the GPU file registered (NV_ESC_REGISTER_FD) before use."""
  o = run["open"]
  assert o["iface"] == "MOCKIface" and o["arch"] == "sm_86"
  assert (o["compute_class"], o["dma_class"], o["gpfifo_class"], o["usermode_class"]) == \
    (AMPERE_COMPUTE_B, AMPERE_DMA_COPY_B, AMPERE_CHANNEL_GPFIFO_A, TURING_USERMODE_A)
  assert o["gr"] == [7, 6, 2, 48]
  assert len(set(o["tokens"])) == 2 and o["timeline"] >= 3
  paths = [p for p, _ in o["ioctls"]]
  nrs = [(p, req & 0xFF) for p, req in o["ioctls"]]
  assert nrs[0] == ("/dev/nvidiactl", 0x2B)                         # NV_ESC_RM_ALLOC of the root client
  assert ("/dev/nvidiactl", 200) in nrs and ("/dev/nvidia2", 201) in nrs   # CARD_INFO, REGISTER_FD
  assert nrs.index(("/dev/nvidiactl", 200)) < nrs.index(("/dev/nvidia2", 201))
  assert "/dev/nvidia-uvm" in paths and "/dev/nvidia0" not in paths


def test_alloc_copy_round_trip(run):
  """tinygrad's NVAllocator: alloc, _copyin and _copyout of 12 KiB + 100 bytes through its copy queue (staging buffers,
  LAUNCH_DMA, semaphores) on our copy engine; the bytes come back unchanged, and differ from zeros."""
  c = run["copy"]
  data = np.array(c["in"], np.uint8)
  np.testing.assert_array_equal(np.array(c["out"], np.uint8), data)
  assert data.any()


def test_elementwise(run):
  """exp2(a*b + 1) over a 6x10 float32 tensor: tinygrad's PTX kernel, launched by its QMD, vs numpy."""
  e = run["elementwise"]
  a, b = np.array(e["a"], np.float32), np.array(e["b"], np.float32)
  np.testing.assert_allclose(np.array(e["out"], np.float32), np.exp2(a * b + 1), rtol=1e-6, atol=1e-6)


def test_reduction(run):
  """Row sums and the global max of a 6x10 tensor (tinygrad's reduce kernels) vs numpy."""
  r = run["reduction"]
  a = np.array(r["a"], np.float32)
  np.testing.assert_allclose(np.array(r["sum1"], np.float32), a.sum(axis=1), rtol=1e-5, atol=1e-5)
  assert r["max"] == float(a.max())


def test_matmul(run):
  """(8x12) @ (12x5) float32: tinygrad's matmul kernel (shared-memory address operands `local0[0]`) vs numpy."""
  m = run["matmul"]
  a, b = np.array(m["a"], np.float32), np.array(m["b"], np.float32)
  np.testing.assert_allclose(np.array(m["out"], np.float32), a @ b, rtol=1e-5, atol=1e-5)


def test_jit_replay(run):
  """A two-kernel TinyJit step called 5 times: tinygrad builds one HCQGraph and replays it (its signals and timeline
  reused, the timeline advancing on every call); each call's output vs numpy for that call's inputs."""
  r = run["replay"]
  assert r["graphs"] == 1 and r["replays"] >= 3
  last = -1
  for k in r["runs"]:
    x, y = np.array(k["x"], np.float32), np.array(k["y"], np.float32)
    np.testing.assert_allclose(np.array(k["out"], np.float32), np.maximum(x * y + 1, 0) * 2 - x, rtol=1e-6,
                               atol=1e-6)
    before, after = k["timeline"]
    assert after > before >= last
    last = after


def _stream(which: str) -> dict:
  env = {**os.environ, "DEV": "MOCK:2+NV:PTX", "PYTHONPATH": os.pathsep.join([str(PROVEN), *sys.path])}
  p = subprocess.run([sys.executable, str(PROVEN / "ioctl_stream.py"), which], capture_output=True, text=True, env=env,
                     timeout=600, cwd=str(PROVEN))
  assert p.returncode == 0, f"{which} driver's stream recording failed:\n{p.stderr[-6000:]}"
  return json.loads(p.stdout)


def _count_diff(a: list, b: list) -> set:
  from collections import Counter
  ca, cb = Counter(map(tuple, a)), Counter(map(tuple, b))
  return {k for k in set(ca) | set(cb) if ca[k] != cb[k]}


# README.md "tinygrad 0.14's NV driver on the mock": every row of its difference table, as stream keys
DOCUMENTED_OPEN = {("ctl", "ESC_RM_ALLOC", c) for c in ("AMPERE_USERMODE_A", "TURING_USERMODE_A", "GT200_DEBUGGER",
                                                         "NV1_MEMORY_SYSTEM", "NV1_MEMORY_USER")} | {
  ("ctl", "ESC_RM_CONTROL", c) for c in ("CTRL_GPU_GET_CLASSLIST", "CTRL_GPU_GET_CLASSLIST_V2", "CTRL_PERF_BOOST")} | {
  ("ctl", "ESC_RM_MAP_MEMORY", ""), ("ctl", "ESC_RM_MAP_MEMORY_DMA", ""), ("gpu", "ESC_REGISTER_FD", ""),
  ("gpu", "ESC_RM_ALLOC_MEMORY", "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR"), ("uvm", "UVM_CREATE_EXTERNAL_RANGE", ""),
  ("uvm", "UVM_MAP_EXTERNAL_ALLOCATION", "")}
DOCUMENTED_WORK = {("ctl", "ESC_RM_MAP_MEMORY_DMA", ""),
                   ("gpu", "ESC_RM_ALLOC_MEMORY", "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR"),
                   ("uvm", "UVM_CREATE_EXTERNAL_RANGE", ""), ("uvm", "UVM_MAP_EXTERNAL_ALLOCATION", "")}
# host methods (clc56f.h): NON_STALL_INTERRUPT 0x20, SEM_ADDR_LO..SEM_EXECUTE 0x5c..0x6c, WFI 0x78
DOCUMENTED_METHODS = {("compute", "host", hex(m)) for m in (0x20, 0x5C, 0x60, 0x64, 0x68, 0x6C, 0x78)}
DOCUMENTED_QMD = ("REGISTER_COUNT_V", "MIN_SM_CONFIG_SHARED_MEM_SIZE", "TARGET_SM_CONFIG_SHARED_MEM_SIZE",
                  "CONSTANT_BUFFER_SIZE_SHIFTED4_0", "PROGRAM_PREFETCH_", "RELEASE0_", "RELEASE1_", "DEPENDENT_QMD0_",
                  "CTA_RASTER_", "CTA_THREAD_DIMENSION", "_ADDR")


def test_stream_differences_are_documented():
  """tinygrad's driver and ours, each recorded by tests/proven/ioctl_stream.py doing the same work on mock GPU 2 (open,
  copy two arrays in, one add kernel, copy out; both sums vs numpy): the ioctls, GPU methods and QMD fields that differ
  are exactly those README.md's table justifies, and each driver's stream is its own (not empty)."""
  tg, us = _stream("tinygrad"), _stream("ours")
  assert tg["ok"] and us["ok"]
  assert _count_diff(tg["open"], us["open"]) <= DOCUMENTED_OPEN
  assert _count_diff(tg["work"], us["work"]) <= DOCUMENTED_WORK
  assert _count_diff([m[:3] for m in tg["methods"]], [m[:3] for m in us["methods"]]) <= DOCUMENTED_METHODS
  qmd_diff = {k for k in set(tg["qmd"]) | set(us["qmd"]) if tg["qmd"].get(k) != us["qmd"].get(k)}
  assert all(any(d in k for d in DOCUMENTED_QMD) for k in qmd_diff), qmd_diff
  # the copy engine's methods agree one for one; both open with the same first RM objects
  copy = lambda s: [m[:3] for m in s["methods"] if m[0] == "copy"]  # noqa: E731
  assert copy(tg) == copy(us) and len(copy(tg)) > 10
  assert tg["open"][:5] == us["open"][:5] == [["ctl", "ESC_RM_ALLOC", "NV01_ROOT_CLIENT"],
                                              ["ctl", "ESC_RM_CONTROL", "CTRL_SYSTEM_GET_BUILD_VERSION_V2"],
                                              ["uvm", "UVM_INITIALIZE", ""], ["uvm", "UVM_MM_INITIALIZE", ""],
                                              ["ctl", "ESC_CARD_INFO", ""]]
