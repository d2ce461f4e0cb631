"""The NV device's command ring wraps without stalling. Wrapping waited for every timeline value taken so far
(`synchronize`), including the one of the submission being built, which is not submitted yet: the first wrap (after
~26,000 small ops with the 2 MB ring) then waited 30 s and raised TimeoutError, and every later op did too. Run in a
child process with a 16 KB ring so that it wraps many times in a few hundred ops; results checked against numpy."""
import os
import subprocess
import sys

CHILD = r"""
import numpy as np
import tiny_runtime_nv.device as nvdev
nvdev.CMDQ_SIZE = 1 << 14  # before the device opens: a ring that wraps every ~200 submissions
from tiny_tensor import Tensor
x = np.arange(8, dtype=np.float32)
a = Tensor(x, device="MOCK+NV").realize()
for i in range(1500): a = (a + 1).realize()
np.testing.assert_array_equal(a.numpy(), x + 1500)
print("ok")
"""


def test_command_ring_wraps_without_waiting_for_the_submission_being_built():
  env = {**os.environ, "DEV": "MOCK+NV"}
  p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-4000:]
