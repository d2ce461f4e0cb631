"""Record the KGSL ioctl stream and the a6xx command stream of one QCOM driver on the mock a630, for README.md's
comparison of tinygrad 0.14's QCOM driver with ours (issue #32).

`python cmd_stream.py tinygrad` or `python cmd_stream.py ours` (this folder and the packages on PYTHONPATH): opens the
device, then copies two 256-float arrays in, adds them with one kernel and copies the sum out. Prints JSON: "open" and
"work" lists of ioctls ([ioctl, key fields]), the "packets" the mock command processor ran for the work (type 7:
[opcode, fields]; type 4: [register, value or "addr"]), and "ok" (the sum matched numpy).

Normalized (differ run to run, or by allocation layout only): GPU addresses (registers that hold one read "addr",
packets that carry one drop it), object and context ids, timestamps, signal values, object sizes (sizes go in
"sizes", not in the compared keys).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Any

import numpy as np

from tiny_runtime_qcom import a6xx
from tiny_runtime_qcom.mock import cp as mock_cp
from tiny_runtime_qcom.mock import driver as mock_driver

IOCTLS: list[list[Any]] = []
PACKETS: list[list[Any]] = []
SIZES: list[int] = []
# registers whose value is a GPU address (or half of one): compared as "addr"
ADDR_REGS = {a6xx.REG_SP_CS_BASE, a6xx.REG_SP_CS_PVT_MEM_BASE, a6xx.REG_SP_CS_SAMPLER_BASE,
             a6xx.REG_SP_CS_TEXMEMOBJ_BASE, a6xx.REG_SP_CS_UAV_BASE, a6xx.REG_TPL1_CS_BORDER_COLOR_BASE}
ADDR_REGS |= {r + 1 for r in ADDR_REGS}
EVENTS = {a6xx.CACHE_FLUSH_TS: "CACHE_FLUSH_TS", a6xx.CACHE_INVALIDATE: "CACHE_INVALIDATE"}

_ioctl, _regs, _op = mock_driver.MockKGSL.ioctl, mock_cp.CommandProcessor._regs, mock_cp.CommandProcessor._op


def ioctl_key(name: str, a: Any) -> list[Any]:
  """[ioctl name, its fields that say what was asked] (ids, addresses, timestamps and sizes left out)."""
  if name == "GPUOBJ_ALLOC":
    SIZES.append(int(a.size))
    return [name, f"flags={int(a.flags):#x}"]
  if name == "DRAWCTXT_CREATE": return [name, f"flags={int(a.flags):#x}"]
  if name in ("DEVICE_GETPROPERTY", "SETPROPERTY"): return [name, f"type={int(a.type):#x}"]
  if name == "CMDSTREAM_READTIMESTAMP_CTXTID": return [name, f"type={int(a.type)}"]
  if name == "GPU_COMMAND": return [name, f"flags={int(a.flags):#x}", f"numcmds={int(a.numcmds)}"]
  return [name]


def _logged_ioctl(self: Any, name: str, a: Any) -> None:
  _ioctl(self, name, a)  # after the call: outputs are filled, and a refused ioctl is not a step of the stream
  IOCTLS.append(ioctl_key(name, a))


def _logged_regs(self: Any, reg: int, vals: tuple[int, ...], where: str) -> None:
  for k, v in enumerate(vals):
    r = reg + k
    PACKETS.append([a6xx.REGISTERS.get(r, hex(r)), "addr" if r in ADDR_REGS else hex(v)])
  _regs(self, reg, vals, where)


def packet_key(op: int, b: tuple[int, ...]) -> list[Any]:
  """[opcode name, the fields that say what it does] (addresses, signal values left out)."""
  name = a6xx.OPCODE_NAMES.get(op, hex(op))
  if op == a6xx.CP_EVENT_WRITE and b: return [name, EVENTS.get(b[0] & 0xFF, hex(b[0]))]
  if op == a6xx.CP_SET_MARKER and b: return [name, f"mode={b[0] & 0xF}"]
  if op == a6xx.CP_WAIT_REG_MEM and b: return [name, f"function={b[0] & 7}", f"mask={b[4]:#x}" if len(b) > 4 else ""]
  if op == a6xx.CP_REG_TO_MEM and b: return [name, f"{b[0]:#x}"]
  if op == a6xx.CP_LOAD_STATE6_FRAG and b:
    st, src, sb, units = (b[0] >> 14) & 3, (b[0] >> 16) & 3, (b[0] >> 18) & 0xF, b[0] >> 22
    return [name, f"type={st}", f"src={src}", f"block={sb}", f"units={units}"]
  if op == a6xx.CP_NOP: return [name, f"len={len(b)}"]
  if op == a6xx.CP_RUN_OPENCL and b: return [name, hex(b[0])]
  return [name]


def _logged_op(self: Any, op: int, b: tuple[int, ...], where: str, depth: int) -> None:
  PACKETS.append(packet_key(op, b))
  _op(self, op, b, where, depth)


def _record() -> None:
  mock_driver.MockKGSL.ioctl = _logged_ioctl  # type: ignore[method-assign]
  mock_cp.CommandProcessor._regs = _logged_regs  # type: ignore[method-assign]
  mock_cp.CommandProcessor._op = _logged_op  # type: ignore[method-assign]


def main(which: str) -> None:
  """Record `which` driver ("tinygrad" or "ours") and print the JSON report."""
  if which not in ("tinygrad", "ours"): raise SystemExit(f"driver {which!r}; valid: tinygrad, ours")
  _record()
  a = np.arange(256, dtype=np.float32)
  b = np.full(256, 0.5, np.float32)
  if which == "tinygrad":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    os.environ["DEV"] = "MOCK+QCOM"
    import run_tinygrad_qcom  # noqa: F401  (the mock compiler swap and tinygrad's MOCK FileIOInterface)
    from test.mockgpu import mockgpu
    from tinygrad import Device, Tensor
    # the mock's GPU thread paused: submissions run at tinygrad's KGSL timestamp waits, as ours do, so the stream does
    # not depend on whether the thread finished the work before the host began to wait (then tinygrad issues no wait)
    mockgpu.gpu_running.clear()
    Device["QCOM"].synchronize()
    dev = "QCOM"
    mk: Any = Tensor
  else:
    from tiny_tensor import Tensor as TTensor
    from tiny_uop.plugins import Device as TDevice
    dev = "MOCK+QCOM"
    TDevice[dev].synchronize()
    mk = TTensor
  n_open = len(IOCTLS)
  mock_driver.driver().cp  # noqa: B018  (the command processor exists before the work: no packet is lost)
  PACKETS.clear()
  ta, tb = mk(a, device=dev).realize(), mk(b, device=dev).realize()
  out = (ta + tb).numpy()
  json.dump({"open": IOCTLS[:n_open], "work": IOCTLS[n_open:], "packets": PACKETS, "sizes": SIZES,
             "ok": bool(np.array_equal(out, a + b))}, sys.stdout)


if __name__ == "__main__":
  main(sys.argv[1])
