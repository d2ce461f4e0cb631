"""Record what a driver asks of the mock KFD for one small program: a copy in, one elementwise kernel, a copy out.

`python record_streams.py tinygrad` runs tinygrad 0.14's AMD driver (as run_tinygrad_amd.py does), `python
record_streams.py ours` tiny-tensor on our driver (DEV=MOCK+AMD); each prints one JSON line `STREAM [[kind, name,
detail], ...]`: every ioctl (with the fields that say what was asked), every PM4 packet the MEC executed (SET_SH_REG
with its register names) and every SDMA packet, from the device's opening to the result on the host. The README's
"tinygrad's driver on the mock" table is the diff of the two, collapsed to distinct entries
(`python record_streams.py diff`).
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def record_tinygrad() -> list[tuple[str, str, str]]:
  """tinygrad's driver on the default mock (four gfx1100s)."""
  sys.path.insert(0, str(HERE))
  import run_tinygrad_amd as r  # noqa: F401  (sets DEV and swaps in our compiler)
  from test.mockgpu import mockgpu

  import numpy as np
  drv = mockgpu.kfd()
  drv.trace = []
  from tinygrad import Tensor
  out = (Tensor(np.arange(16, dtype=np.float32), device="AMD") + 1).numpy()
  assert out[3] == 4.0
  return drv.trace


def record_ours() -> list[tuple[str, str, str]]:
  """Our driver (tiny-tensor, DEV=MOCK+AMD) on the default mock."""
  import numpy as np
  from tiny_runtime_amd.mock.driver import driver
  drv = driver()
  drv.trace = []
  from tiny_tensor import Tensor
  out = (Tensor(np.arange(16, dtype=np.float32), device="MOCK+AMD") + 1).numpy()
  assert out[3] == 4.0
  return drv.trace


def run(which: str) -> list[list[str]]:
  """The stream of `which` (tinygrad or ours), recorded in a fresh subprocess."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
  env.pop("DEV", None)
  proc = subprocess.run([sys.executable, __file__, which], capture_output=True, text=True, env=env, timeout=300)
  line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STREAM ")), None)
  if line is None: raise RuntimeError(f"recording {which} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(line[len("STREAM "):])


def diff() -> dict[str, dict[str, int]]:
  """Counts of each (kind, name, detail) entry in tinygrad's stream and ours, where they differ."""
  counts = {w: collections.Counter(" ".join(e).strip() for e in run(w)) for w in ("tinygrad", "ours")}
  keys = sorted(set(counts["tinygrad"]) | set(counts["ours"]))
  return {k: {"tinygrad": counts["tinygrad"][k], "ours": counts["ours"][k]} for k in keys
          if counts["tinygrad"][k] != counts["ours"][k]}


if __name__ == "__main__":
  what = sys.argv[1] if len(sys.argv) > 1 else "diff"
  if what == "diff":
    for k, v in diff().items(): print(f"{v['tinygrad']:4d} {v['ours']:4d}  {k}")
  elif what in ("tinygrad", "ours"):
    print("STREAM " + json.dumps(record_tinygrad() if what == "tinygrad" else record_ours()))
  else: raise SystemExit(f"unknown mode {what!r}; valid: tinygrad, ours, diff")
