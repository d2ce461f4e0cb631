"""The shared HCQ kernel-argument ring (`HCQCompiled.kernargs_alloc`: 1 MB on AMD, 4 MB on NV) wraps with
`synchronize()`, which waits for every timeline value taken so far. An allocation made after its submission's timeline
value was taken would wait for a submission not yet built: a TimeoutError after 30 s (NV's command-ring bug,
tiny-runtime-nv's `test_nv_cmdq_wrap.py`). Eager launches take their arguments first; HCQ2Graph replays take a
timeline value and write only their own argument buffer. This pins that order, on MOCK+AMD and MOCK+NV, with a TinyJit
graph replayed between eager launches: in a child process with a 1-4 KB ring that wraps every few launches (the wraps
are counted), so each wrap waits for replays' timeline values; results checked against numpy; a hang fails at the
subprocess timeout."""
import os
import subprocess
import sys

import pytest

CHILD = r"""
import os
import numpy as np
from tiny_tensor import Tensor, TinyJit
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.plugins import Device
DEV = os.environ["DEV"]
if DEV == "MOCK+NV":
  import tiny_runtime_nv.device as nvdev
  nvdev.KERNARGS_SIZE = 1 << 12  # before the device opens: a few argument regions, a wrap every few launches
dev = Device[DEV]
if DEV == "MOCK+AMD":
  dev.synchronize()
  dev.kernargs, dev._kernargs_ptr = dev.kernargs.offset(0, 1 << 10), 0  # 4 argument regions: a wrap every 4 launches
wraps, alloc = [0], dev.kernargs_alloc
def counting(size):
  before = dev._kernargs_ptr
  addr = alloc(size)
  wraps[0] += dev._kernargs_ptr < before + size  # the pointer went back: the ring wrapped
  return addr
dev.kernargs_alloc = counting

@TinyJit
def f(a, b):
  h = (a * 2 + b).contiguous()
  return (h - a).realize(), (h * b).sum().realize()

x = np.arange(16, dtype=np.float32)
acc = Tensor(x, device=DEV).realize()
builds = HCQ2Graph.builds
for i in range(60):
  y = np.full(16, 0.5 * i, dtype=np.float32)
  a, b = Tensor(x + i, device=DEV).realize(), Tensor(y, device=DEV).realize()
  for _ in range(i % 4): acc = (acc + 1).realize()  # a varying count: replays meet the ring at every phase
  d, s = f(a, b)
  h = (x + i) * 2 + y
  np.testing.assert_allclose(d.numpy(), h - (x + i), rtol=1e-6)
  np.testing.assert_allclose(s.numpy(), (h * y).sum(), rtol=1e-5)
np.testing.assert_array_equal(acc.numpy(), x + 90)
assert HCQ2Graph.builds == builds + 1, "the jitted function did not replay through one HCQ2Graph"
assert wraps[0] >= 20, f"the argument ring wrapped only {wraps[0]} times"
print("ok")
"""


@pytest.mark.parametrize("dev", ["MOCK+AMD", "MOCK+NV"])
def test_kernarg_ring_wraps_between_hcq2_graph_replays(dev):
  env = {**os.environ, "DEV": dev}
  p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=240)
  assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-4000:]
