"""The batched engine's driver: compile a code object once (`Program`), run a batch of waves through it in lockstep
(`execute`), and the entry points `rdna3.Emulator.run*` calls (`run_launch`, `run_waves`, `launch_waves`).

Above the engine's parts: the batch state (`batch.py`), the instruction compilers (`batch_ops.py` and the formats it
collects, `batch_salu/valu/mem/g9.py`, imported here so that they register), the decoder and wave state (`state.py`).
Nothing here imports the interpreter (`rdna3.py`): it is handed in as `emu`. The execution order: batch.py's docstring.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tiny_runtime_amd.emu import batch_g9, batch_mem, batch_salu, batch_valu  # noqa: F401 (they register compilers)
from tiny_runtime_amd.emu.batch import END, Batch, Launch, _norm
from tiny_runtime_amd.emu.batch_ops import compile_inst
from tiny_runtime_amd.emu.isa import EXEC_LO, MASK32
from tiny_runtime_amd.emu.state import Memory, Wave, Wave64

_IMAGES_BYTES = 1 << 26  # code images (and their compiled programs) kept by content, at most this many bytes
_BIG = 1 << 62  # the pc of a wave that ended


class Program:
  """A code object's instructions, decoded and compiled once: pc -> op. A program known by its bytes (`image`: the
  code from the entry to the end of its allocation) is shared by every address those bytes are loaded at; else it
  belongs to one address and `raw` keeps the bytes each instruction was decoded from, so a later run can check the
  code there is still the same (`valid`)."""

  def __init__(self, code_addr: int, image: bytes | None = None):
    self.code_addr, self.image = code_addr, image
    self.ops: dict[int, Callable[[Batch], int]] = {}
    self.raw: dict[int, bytes] = {}
    self.lo, self.hi = 1 << 62, 0

  def valid(self, mem: Memory) -> bool:
    if self.image is not None or not self.raw: return True
    span = mem.read(self.code_addr + self.lo, self.hi - self.lo)
    return all(span[pc - self.lo:pc - self.lo + len(b)] == b for pc, b in self.raw.items())

  def compile(self, emu: Any, pc: int, code_addr: int) -> Callable[[Batch], int]:
    # the 16 bytes the per-wave interpreter reads (from memory when they run past the image: the same faults)
    img = self.image
    raw = img[pc:pc + 16] if img is not None and pc + 16 <= len(img) else emu.mem.read(code_addr + pc, 16)
    inst = emu.decode(raw, 0)
    op = self.ops[pc] = compile_inst(emu, inst, pc)
    self.raw[pc] = bytes(raw)
    self.lo, self.hi = min(self.lo, pc), max(self.hi, pc + 16)
    return op


def execute(emu: Any, prog: Program, b: Batch) -> None:
  """Run the batch from pc 0 until every wave has reached s_endpgm (see the module docstring for the order)."""
  ops, limit = prog.ops, emu.max_steps
  pc, steps, together = 0, 0, 0  # together: steps run while all waves were at one pc
  wpc: np.ndarray | None = None  # per-wave pcs once the waves went apart (_BIG: ended)
  wave_steps = np.zeros(b.N, np.int64)
  try:
    while True:
      if wpc is None:  # every wave at pc: the hot loop
        op = ops.get(pc) or prog.compile(emu, pc, b.code_addr)
        r = op(b)
        steps += b.N
        together += 1
        if r >= 0:
          pc = r
          if together > limit: _too_long(limit)
          continue
        if r == END: return
        wpc = np.array(np.broadcast_to(b.npc, (b.N,)), dtype=np.int64)
        continue
      pc = int(wpc.min())
      if pc >= _BIG: return
      wm = wpc == pc
      if wm.all():  # together again (and none ended)
        wpc, b.wm = None, None
        b.refresh_mask()
        continue
      b.wm = wm
      b.refresh_mask()
      op = ops.get(pc) or prog.compile(emu, pc, b.code_addr)
      r = op(b)
      n = int(wm.sum())
      steps += n
      wave_steps[wm] += 1
      if r >= 0: wpc[wm] = r
      elif r == END: wpc[wm] = _BIG
      else: wpc[wm] = np.broadcast_to(b.npc, (b.N,))[wm]
      if together + int(wave_steps.max()) > limit: _too_long(limit)
  finally:
    emu.steps += steps
    b.wm = None


def _too_long(limit: int) -> None: raise RuntimeError(f"wave did not reach s_endpgm in {limit} instructions")


# ***** entry points used by rdna3.Emulator *****

def program(emu: Any, code_addr: int) -> Program:
  """The compiled program at `code_addr`: by content when the memory can say which bytes are the code (the mock's
  `code_bytes`), else by address (decoded again when the bytes there changed)."""
  d = emu.__dict__
  image = emu.mem.code_bytes(code_addr) if hasattr(emu.mem, "code_bytes") else None
  if image is not None:
    by_image = d.setdefault("_by_image", {})
    if (p := by_image.get(image)) is None:
      held = d.get("_by_image_bytes", 0) + len(image)
      if len(by_image) >= 4096 or held > _IMAGES_BYTES:  # bounded memory: start over
        by_image.clear()
        held = len(image)
      d["_by_image_bytes"] = held
      p = by_image[image] = Program(code_addr, image)
    return p
  progs = d.setdefault("_programs", {})
  p = progs.get(code_addr)
  if p is None or not p.valid(emu.mem): p = progs[code_addr] = Program(code_addr)
  return p


def run_launch(emu: Any, code_addr: int, launch: Launch) -> Batch:
  """Run every wave of `launch` from `code_addr` to s_endpgm."""
  b = Batch(emu, code_addr, launch)
  with np.errstate(all="ignore"): execute(emu, program(emu, code_addr), b)
  return b


def run_waves(emu: Any, groups: list[list[Wave]], code_addr: int) -> None:
  """Run work-groups given as `Wave` objects (each group's waves share its `lds`), writing the final registers, SCC
  and LDS back into them."""
  waves = [w for g in groups for w in g]
  if not waves: return
  W, gw = waves[0].size, len(groups[0])
  if any(len(g) != gw for g in groups):  # groups of different sizes: one batch each
    for g in groups: run_waves(emu, [g], code_addr)
    return
  n = len(waves)
  ex = np.array([w.exec for w in waves], dtype=np.uint64)
  regs = sorted({r for w in waves for r in w.vgpr})
  launch = Launch(n, W, gw, ex, lds_bytes=max((len(g[0].lds) for g in groups), default=0),
                  scratch_size=waves[0].scratch_size)
  for r in range(128):
    if r == EXEC_LO or (W == 64 and r == EXEC_LO + 1): continue
    vals = [w.sgpr[r] & MASK32 for w in waves]
    launch.sgpr[r] = vals[0] if all(v == vals[0] for v in vals) else np.array(vals, np.int64)
  for r in regs:
    launch.vgpr[r] = np.array([v for w in waves for v in (w.vgpr[r] if r in w.vgpr else [0] * W)], np.uint64) \
      .astype(np.uint32)
  b = Batch(emu, code_addr, launch)
  b.priv_ok = False  # the waves' own PrivateMemory objects hold their private bytes (see carriers)
  b.scc = _norm(np.array([w.scc for w in waves], np.int64), n) if n > 1 else waves[0].scc
  for gi, g in enumerate(groups):
    if len(g[0].lds): b.lds_buf[gi * b.lds_bytes:gi * b.lds_bytes + len(g[0].lds)] = g[0].lds
  for i, w in enumerate(waves):  # fallbacks keep using each wave's own private memory
    if w.scratch: b.carrier(i).scratch = w.scratch
  try:
    with np.errstate(all="ignore"): execute(emu, program(emu, code_addr), b)
  finally:
    for gi, g in enumerate(groups):
      lds = b.lds_buf[gi * b.lds_bytes:(gi + 1) * b.lds_bytes]
      for buf in {id(w.lds): w.lds for w in g}.values(): buf[:] = lds[:len(buf)]
    for i, w in enumerate(waves):
      c = b.carriers[i]
      if c is not None: w.scratch = c.scratch
      w.sgpr = [b._wave_val(v, i) for v in b.S]
      sc = b.scc
      w.scc = sc if type(sc) is int else int(sc[i])
      for r, col in b.V.items():
        if r < 256 or r in w.vgpr: w.vgpr[r] = col[i * W:(i + 1) * W].tolist()


def launch_waves(launch: Launch) -> list[list[Wave]]:
  """The work-groups of a launch as `Wave` objects (what the per-wave interpreter runs), each group sharing one LDS."""
  groups, W = [], launch.lanes
  for g0 in range(0, launch.n_waves, launch.group_waves):
    lds, group = bytearray(launch.lds_bytes), []
    for i in range(g0, g0 + launch.group_waves):
      w = Wave(lds=lds) if W == 32 else Wave64(lds=lds)
      for r, v in launch.sgpr.items(): w.sgpr[r] = v if type(v) is int else int(np.asarray(v)[i])
      ex = int(launch.exec[i])
      w.sgpr[EXEC_LO] = ex & MASK32
      if W == 64: w.sgpr[EXEC_LO + 1] = ex >> 32
      for r, col in launch.vgpr.items(): w.vgpr[r] = col[i * W:(i + 1) * W].tolist()
      w.scratch_size = launch.scratch_size
      group.append(w)
    groups.append(group)
  return groups


__all__ = ["Program", "execute", "launch_waves", "program", "run_launch", "run_waves"]
