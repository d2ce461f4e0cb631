"""Record the RM/UVM ioctl stream and the GPU methods of one driver on the mock GA102 (mock GPU 2), for
packages/tiny-runtime-nv/README.md's comparison of tinygrad 0.14's NV driver with ours.

`python ioctl_stream.py tinygrad` (with DEV=MOCK:2+NV:PTX and this folder on PYTHONPATH) or `python ioctl_stream.py
ours`: opens the device, then copies two 256-float arrays in, adds them with one kernel and copies the sum out. Prints
JSON: "open" and "work" lists of decoded ioctls ([file, ioctl, class or control]) and the "methods" the mock GPU ran
for the work ([channel, engine class, method, value]), plus "ok" (the sum matched numpy).
"""
from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from tiny_runtime_nv import rm
from tiny_runtime_nv.mock import rm as mock_rm

LOG: list[tuple[str, int, bytes]] = []
_ioctl = mock_rm.MockFileIO.ioctl
CTRL_NAMES = {v: k for k, v in vars(rm).items() if k.startswith("CTRL_") and isinstance(v, int)}
CLASS_NAMES = {getattr(rm, k): k for k in (
  "NV01_ROOT_CLIENT", "NV01_DEVICE_0", "NV20_SUBDEVICE_0", "NV01_MEMORY_VIRTUAL", "NV1_MEMORY_USER",
  "NV1_MEMORY_SYSTEM", "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR", "FERMI_VASPACE_A", "KEPLER_CHANNEL_GROUP_A",
  "FERMI_CONTEXT_SHARE_A", "TURING_USERMODE_A", "AMPERE_USERMODE_A", "HOPPER_USERMODE_A", "AMPERE_CHANNEL_GPFIFO_A",
  "HOPPER_CHANNEL_GPFIFO_A", "AMPERE_COMPUTE_A", "AMPERE_COMPUTE_B", "ADA_COMPUTE_A", "HOPPER_COMPUTE_A",
  "AMPERE_DMA_COPY_A", "AMPERE_DMA_COPY_B", "HOPPER_DMA_COPY_A", "GT200_DEBUGGER")}
ESC_NAMES = {v: k for k, v in vars(rm).items() if k.startswith("ESC_") and isinstance(v, int)}


def _logged_ioctl(self: Any, request: int, arg: Any) -> int:
  LOG.append((self.path, request, bytes(arg)))
  return _ioctl(self, request, arg)


def decode(path: str, request: int, data: bytes) -> list[str]:
  """[file, ioctl name, class/control name] of one logged ioctl."""
  ffi = rm.layouts(mock_rm.BRANCH)
  f = "uvm" if path == rm.NVIDIA_UVM else ("ctl" if path == rm.NVIDIACTL else "gpu")
  if f == "uvm": return [f, rm.UVM_IOCTLS.get(request, hex(request)).removesuffix("_PARAMS"), ""]
  nr = request & 0xFF
  name = ESC_NAMES.get(nr, hex(nr))
  extra = ""
  if nr == rm.ESC_RM_ALLOC: extra = CLASS_NAMES.get(ffi.from_buffer("NVOS21_PARAMETERS *", bytearray(data)).hClass, "?")
  elif nr == rm.ESC_RM_CONTROL:
    cmd = ffi.from_buffer("NVOS54_PARAMETERS *", bytearray(data)).cmd
    extra = CTRL_NAMES.get(cmd, hex(cmd))
  elif nr == rm.ESC_RM_ALLOC_MEMORY:
    extra = CLASS_NAMES.get(ffi.from_buffer("nv_ioctl_nvos02_parameters_with_fd *", bytearray(data)).params.hClass, "?")
  return [f, name, extra]


def main(which: str) -> None:
  """Record `which` driver ("tinygrad" or "ours") and print the JSON report."""
  mock_rm.MockFileIO.ioctl = _logged_ioctl  # type: ignore[method-assign]
  a = np.arange(256, dtype=np.float32)
  b = np.full(256, 0.5, np.float32)
  if which == "tinygrad":
    from tinygrad import Device, Tensor
    Device["NV"]
    n_open = len(LOG)
    gpu = mock_rm.driver().gpus[2]
    gpu.trace = []
    out = (Tensor(a) + Tensor(b)).numpy()
  else:
    from tiny_tensor import Tensor as TTensor
    from tiny_uop.plugins import Device as TDevice
    TDevice["MOCK+NV:2"]
    n_open = len(LOG)
    gpu = mock_rm.driver().gpus[2]
    gpu.trace = []
    out = (TTensor(a, device="MOCK+NV:2") + TTensor(b, device="MOCK+NV:2")).numpy()
  methods = [[k, CLASS_NAMES.get(c, hex(c)) if c else "host", hex(m), hex(v)] for k, c, m, v in gpu.trace]
  json.dump({"open": [decode(*x) for x in LOG[:n_open]], "work": [decode(*x) for x in LOG[n_open:]],
             "methods": methods, "qmd": {k: v for k, v in gpu.last_qmd.get("fields", {}).items() if v},
             "ok": bool(np.array_equal(out, a + b))}, sys.stdout)


if __name__ == "__main__":
  main(sys.argv[1])
