"""The mock a630's command processor: decodes and executes a6xx command streams, rejecting malformed ones.

`CommandProcessor.run(addr, ndwords)` executes one indirect buffer (what KGSL's GPU_COMMAND submits). Every header is
checked: packet type (4 or 7 only), the odd parity bits over count and register/opcode, reserved bits. Type-4 packets
may only write registers of the compute state the mock knows (`a6xx.REGISTERS`, by name). Type-7 packets are decoded
by opcode with their payload length and fields checked: CP_LOAD_STATE6_FRAG (state type, source, block, units; the
state is read from memory when the packet runs, as the hardware does), CP_WAIT_REG_MEM, CP_EVENT_WRITE,
CP_REG_TO_MEM (the always-on counter), CP_INDIRECT_BUFFER (IB2; no deeper), CP_SET_MARKER, CP_WAIT_FOR_IDLE,
CP_WAIT_MEM_WRITES, CP_NOP, and the dispatches CP_RUN_OPENCL / CP_EXEC_CS, which check that the programmed state is
consistent (shader address and size, register footprint and shared memory against the binary's, const file length,
descriptor counts, NDRANGE against the work-group counts) before `gpu.Runner` runs the kernel. CP_EVENT_WRITE acts on
the cache model (`UCHE`): a dispatch's writes stay in the GPU's L2 until a CACHE_FLUSH_TS (or KGSL's end-of-submission
CACHE_FLUSH_TS) writes them back; CACHE_INVALIDATE drops every line, dirty ones with their data. A violation raises
`MalformedPacket` (a `GPUFault`) naming the packet, its offset and the field; the faulting packet is dropped and the
rest of the IB runs (so the submission still signals its fence), then the fault is raised. A malformed header ends
the IB (its length can't be trusted).
"""
from __future__ import annotations

import ctypes
import struct
import time
from typing import Any, Callable

from tiny_runtime_qcom import a6xx
from tiny_runtime_qcom.a6xx import odd_parity_bit
from tiny_runtime_qcom.mock.gpu import Dispatch, GPUFault, parse_image

ALWAYS_ON_HZ = 19_200_000
NUM_UNIT_BITS = 10  # CP_LOAD_STATE6_0 bits 31:22 (tests/test_truth.py checks the width against Mesa's mask)
# bytes per CP_LOAD_STATE6 unit, by (state block, state type) -- a6xx: shader instructions in 128-byte groups,
# constants in vec4s, texture/UAV descriptors of 16 dwords, samplers of 4 dwords
UNIT_BYTES = {(a6xx.SB6_CS_SHADER, a6xx.ST6_SHADER): 128, (a6xx.SB6_CS_SHADER, a6xx.ST6_CONSTANTS): 16,
              (a6xx.SB6_CS_SHADER, a6xx.ST6_UAV): 64, (a6xx.SB6_CS_TEX, a6xx.ST6_CONSTANTS): 64,
              (a6xx.SB6_CS_TEX, a6xx.ST6_SHADER): 16}
# SP_CS_CNTL_1.CONSTANTRAMMODE (Mesa a6xx.xml enum a6xx_const_ram_mode): CONSTLEN_128/192/256/512, in vec4s
CONST_RAM_VEC4 = (128, 192, 256, 512)
# CP_WAIT_REG_MEM functions (adreno_pm4.xml, enum cp_cond_function): ALWAYS, LT, LE, EQ, NE, GE, GT
WAIT_FUNCS: dict[int, Callable[[int, int], bool]] = {
  0: lambda v, r: True, 1: lambda v, r: v < r, 2: lambda v, r: v <= r, 3: lambda v, r: v == r, 4: lambda v, r: v != r,
  5: lambda v, r: v >= r, 6: lambda v, r: v > r}


class MalformedPacket(GPUFault):
  """A command stream the hardware would reject or misexecute."""


def decode_header(h: int, where: str) -> tuple[int, int, int]:
  """(type, register or opcode, count) of a packet header; MalformedPacket for anything but a well-formed type 4/7."""
  typ = h >> 28
  if typ == 4:
    cnt, reg = h & 0x7F, (h >> 8) & 0x3FFFF
    if (h >> 7) & 1 != odd_parity_bit(cnt): raise MalformedPacket(f"{where}: type-4 header {h:#010x}: count parity")
    if (h >> 27) & 1 != odd_parity_bit(reg): raise MalformedPacket(f"{where}: type-4 header {h:#010x}: register parity")
    if (h >> 26) & 1: raise MalformedPacket(f"{where}: type-4 header {h:#010x}: reserved bit 26 set")
    if cnt == 0: raise MalformedPacket(f"{where}: type-4 header {h:#010x} writes no register")
    return 4, reg, cnt
  if typ == 7:
    cnt, op = h & 0x3FFF, (h >> 16) & 0x7F
    if (h >> 15) & 1 != odd_parity_bit(cnt): raise MalformedPacket(f"{where}: type-7 header {h:#010x}: count parity")
    if (h >> 23) & 1 != odd_parity_bit(op): raise MalformedPacket(f"{where}: type-7 header {h:#010x}: opcode parity")
    if (h >> 24) & 0xF: raise MalformedPacket(f"{where}: type-7 header {h:#010x}: reserved bits 27:24 set")
    return 7, op, cnt
  raise MalformedPacket(f"{where}: header {h:#010x} is not a type-4 or type-7 packet (bits 31:28 = {typ}); a6xx "
                        "streams hold those only")


class UCHE:
  """The a630's unified L2 (UCHE) as far as a driver must manage it: what a dispatch wrote is in the cache, seen by
  later dispatches but not by the host (nor by anything reading memory) until a write-back; an invalidate drops every
  line. The a6xx event list (Mesa `adreno_pm4.xml` vgt_event_type) has CACHE_FLUSH_TS (write back dirty lines, then
  write the timestamp) and CACHE_INVALIDATE (invalidate lines), and Mesa's turnip always writes back before it
  invalidates (`tu6_emit_flushes`: CACHE_FLUSH_TS, then CACHE_INVALIDATE, then CP_WAIT_MEM_WRITES, CP_WAIT_FOR_IDLE),
  as tinygrad 0.14's QCOM queue does: a CACHE_INVALIDATE with dirty lines loses their data here.

  Granularity: whole GPU objects. `dirty` maps an object's start to the GPU's view of its bytes; memory keeps what
  was last written back."""

  def __init__(self, mem: Any):
    self.mem = mem
    self.dirty: dict[int, bytes] = {}
    self.lost = 0  # objects whose dirty data an invalidate dropped

  def dispatch(self, starts: set[int], run: Callable[[], None]) -> None:
    """Run `run` (a dispatch that may write the objects at `starts`) through the cache: it sees the dirty lines, and
    what it changes becomes dirty instead of reaching memory."""
    objs = {s: self.mem.alloc_end(s) - s for s in starts | set(self.dirty)}
    ram = {s: ctypes.string_at(s, n) for s, n in objs.items()}
    for s, data in self.dirty.items(): ctypes.memmove(s, data, len(data))
    try: run()
    finally:
      for s, n in objs.items():
        now = ctypes.string_at(s, n)
        if now != ram[s]: self.dirty[s] = now
        ctypes.memmove(s, ram[s], n)

  def flush(self) -> None:
    """Write every dirty line back to memory."""
    for s, data in self.dirty.items(): ctypes.memmove(s, data, len(data))
    self.dirty.clear()

  def invalidate(self) -> None:
    """Drop every line; a dirty line's data never reaches memory."""
    self.lost += len(self.dirty)
    self.dirty.clear()


class CommandProcessor:
  """Executes command streams against GPU memory `mem` (the mock driver: `check(addr, n)`, `alloc_end(addr)`) and
  runs dispatches with `runner`. Register state persists across submissions, as on the hardware."""

  def __init__(self, mem: Any, runner: Any):
    self.mem, self.runner = mem, runner
    self.regs: dict[int, int] = {}
    self.state: dict[tuple[int, int], tuple[int, bytes]] = {}  # (block, type) -> (source address, bytes)
    self.marker = -1
    self.cache = UCHE(mem)
    self.stats = {"submissions": 0, "packets": 0, "dispatches": 0, "texture_dispatches": 0, "rejected": 0}

  def _read(self, addr: int, n: int, what: str) -> bytes:
    self.mem.check(addr, n, what)
    return ctypes.string_at(addr, n)

  def run(self, addr: int, ndwords: int, depth: int = 1) -> None:
    """Execute the `ndwords` dwords at `addr` (an IB of nesting `depth`)."""
    dw = struct.unpack(f"<{ndwords}I", self._read(addr, 4 * ndwords, f"IB{depth}"))
    i, fault = 0, None
    while i < ndwords:
      where = f"IB{depth} at {addr:#x} dword {i}"
      typ, what, cnt = decode_header(dw[i], where)  # a bad header ends the IB: nothing after it can be trusted
      if i + 1 + cnt > ndwords:
        raise MalformedPacket(f"{where}: packet of {cnt} payload dwords runs past the end of the {ndwords}-dword IB")
      body = dw[i + 1:i + 1 + cnt]
      self.stats["packets"] += 1
      try:
        if typ == 4: self._regs(what, body, where)
        else: self._op(what, body, where, depth)
      except GPUFault as e:  # the faulting packet is dropped (a GPU reset of that dispatch), the IB goes on
        fault = fault or e
      i += 1 + cnt
    if fault is not None: raise fault

  def _regs(self, reg: int, vals: tuple[int, ...], where: str) -> None:
    for k, v in enumerate(vals):
      if reg + k not in a6xx.REGISTERS:
        raise MalformedPacket(f"{where}: write of {v:#x} to register {reg + k:#x}, which is not a compute register "
                              "the mock knows")
      self.regs[reg + k] = v

  def _len(self, op: int, body: tuple[int, ...], n: int | tuple[int, ...], where: str) -> None:
    ok = (n,) if isinstance(n, int) else n
    if len(body) not in ok:
      raise MalformedPacket(f"{where}: {a6xx.OPCODE_NAMES.get(op, hex(op))} with {len(body)} payload dwords; "
                            f"expected {' or '.join(map(str, ok))}")

  def _op(self, op: int, b: tuple[int, ...], where: str, depth: int) -> None:
    name = a6xx.OPCODE_NAMES.get(op)
    if name is None: raise MalformedPacket(f"{where}: CP opcode {op:#x} is not one the mock executes")
    if op == a6xx.CP_NOP: return
    if op in (a6xx.CP_WAIT_FOR_IDLE, a6xx.CP_WAIT_MEM_WRITES): return self._len(op, b, 0, where)
    if op == a6xx.CP_SET_MARKER:
      self._len(op, b, 1, where)
      if b[0] & ~0xF: raise MalformedPacket(f"{where}: CP_SET_MARKER {b[0]:#x}: only MODE (3:0) is used for compute")
      self.marker = b[0] & 0xF
    elif op == a6xx.CP_EVENT_WRITE: self._event(b, where)
    elif op == a6xx.CP_WAIT_REG_MEM: self._wait(b, where)
    elif op == a6xx.CP_REG_TO_MEM:
      self._len(op, b, 3, where)
      reg, cnt = b[0] & 0x3FFFF, (b[0] >> 18) & 0xFFF
      if (reg, cnt, b[0] >> 30) != (a6xx.REG_CP_ALWAYS_ON_COUNTER, 2, 1):
        raise MalformedPacket(f"{where}: CP_REG_TO_MEM of {cnt} registers from {reg:#x} ({b[0]:#x}); the mock copies "
                              "the 64-bit always-on counter (CP_ALWAYS_ON_COUNTER, CNT 2, 64B)")
      dest = b[1] | b[2] << 32
      if dest % 8: raise MalformedPacket(f"{where}: CP_REG_TO_MEM 64-bit destination {dest:#x} is not 8-byte aligned")
      self.mem.check(dest, 8, "CP_REG_TO_MEM destination")
      ctypes.c_uint64.from_address(dest).value = time.perf_counter_ns() * ALWAYS_ON_HZ // 1_000_000_000
    elif op == a6xx.CP_INDIRECT_BUFFER:
      self._len(op, b, 3, where)
      if depth >= 2: raise MalformedPacket(f"{where}: CP_INDIRECT_BUFFER inside an IB2 (a6xx has no IB3)")
      ib, n = b[0] | b[1] << 32, b[2] & 0xFFFFF
      if ib % 4 or b[2] >> 20: raise MalformedPacket(f"{where}: CP_INDIRECT_BUFFER at {ib:#x} size {b[2]:#x}")
      self.run(ib, n, depth + 1)
    elif op == a6xx.CP_LOAD_STATE6_FRAG: self._load_state(b, where)
    elif op == a6xx.CP_RUN_OPENCL:
      self._len(op, b, 1, where)
      if b[0]: raise MalformedPacket(f"{where}: CP_RUN_OPENCL payload {b[0]:#x}, expected 0")
      self._dispatch(where, None)
    elif op == a6xx.CP_EXEC_CS:
      self._len(op, b, 4, where)
      self._dispatch(where, (b[1], b[2], b[3]))
    return None

  def _event(self, b: tuple[int, ...], where: str) -> None:
    if not b: raise MalformedPacket(f"{where}: CP_EVENT_WRITE without an event")
    ev = b[0]
    if ev & ~0xFF: raise MalformedPacket(f"{where}: CP_EVENT_WRITE {ev:#x}: the a6xx path sets EVENT (7:0) only")
    if ev == a6xx.CACHE_FLUSH_TS:
      self._len(a6xx.CP_EVENT_WRITE, b, 4, where)
      addr = b[1] | b[2] << 32
      if addr % 4: raise MalformedPacket(f"{where}: CACHE_FLUSH_TS address {addr:#x} is not 4-byte aligned")
      self.mem.check(addr, 4, "CACHE_FLUSH_TS address")
      self.cache.flush()  # dirty lines written back, then the timestamp
      ctypes.c_uint32.from_address(addr).value = b[3]
    elif ev == a6xx.CACHE_INVALIDATE:
      self._len(a6xx.CP_EVENT_WRITE, b, 1, where)
      self.cache.invalidate()
    else: raise MalformedPacket(f"{where}: CP_EVENT_WRITE event {ev}; the mock knows CACHE_FLUSH_TS, CACHE_INVALIDATE")

  def _wait(self, b: tuple[int, ...], where: str) -> None:
    self._len(a6xx.CP_WAIT_REG_MEM, b, 6, where)
    func, poll = b[0] & 7, (b[0] >> 4) & 3
    if b[0] & ~0x37 or func not in WAIT_FUNCS or poll != a6xx.POLL_MEMORY:
      raise MalformedPacket(f"{where}: CP_WAIT_REG_MEM control {b[0]:#x}: expected a FUNCTION and POLL_MEMORY")
    addr = b[1] | b[2] << 32
    if addr % 4: raise MalformedPacket(f"{where}: CP_WAIT_REG_MEM address {addr:#x} is not 4-byte aligned")
    self.mem.check(addr, 4, "CP_WAIT_REG_MEM address")
    v = ctypes.c_uint32.from_address(addr).value & b[4]
    if not WAIT_FUNCS[func](v, b[3]):  # in-order and alone on the GPU: nothing queued later can release it
      raise GPUFault(f"{where}: CP_WAIT_REG_MEM waits for [{addr:#x}] (= {v}) function {func} {b[3]}, which nothing "
                     "submitted before it writes: the GPU would hang")

  def _load_state(self, b: tuple[int, ...], where: str) -> None:
    if len(b) < 3: raise MalformedPacket(f"{where}: CP_LOAD_STATE6_FRAG with {len(b)} payload dwords; at least 3")
    dst, st, src, sb, units = b[0] & 0x3FFF, (b[0] >> 14) & 3, (b[0] >> 16) & 3, (b[0] >> 18) & 0xF, b[0] >> 22
    if (sb, st) not in UNIT_BYTES:
      raise MalformedPacket(f"{where}: CP_LOAD_STATE6_FRAG of state type {st} into block {sb}: not compute state")
    if dst: raise MalformedPacket(f"{where}: CP_LOAD_STATE6_FRAG DST_OFF {dst}; tiny loads whole tables from 0")
    n = units * UNIT_BYTES[(sb, st)]
    if src == a6xx.SS6_INDIRECT:
      self._len(a6xx.CP_LOAD_STATE6_FRAG, b, 3, where)
      if b[1] & 3: raise MalformedPacket(f"{where}: CP_LOAD_STATE6_FRAG EXT_SRC_ADDR {b[1]:#x} is not 4-byte aligned")
      addr = b[1] | b[2] << 32
      self.state[(sb, st)] = (addr, self._read(addr, n, f"CP_LOAD_STATE6 state (block {sb}, type {st})"))
    elif src == a6xx.SS6_DIRECT:
      self._len(a6xx.CP_LOAD_STATE6_FRAG, b, 3 + n // 4, where)
      self.state[(sb, st)] = (0, struct.pack(f"<{n // 4}I", *b[3:]))
    else: raise MalformedPacket(f"{where}: CP_LOAD_STATE6_FRAG STATE_SRC {src}; the mock knows DIRECT and INDIRECT")

  def reg(self, r: int) -> int: return self.regs.get(r, 0)
  def reg64(self, r: int) -> int: return self.reg(r) | self.reg(r + 1) << 32

  def _dispatch(self, where: str, groups: tuple[int, int, int] | None) -> None:
    """Check the programmed compute state and run the kernel."""
    def bad(msg: str) -> MalformedPacket: return MalformedPacket(f"{where}: dispatch: {msg}")
    if self.marker != a6xx.RM6_COMPUTE: raise bad(f"CP_SET_MARKER mode is {self.marker}, not RM6_COMPUTE")
    r = self.reg
    cfg = r(a6xx.REG_SP_CS_CONFIG)
    if not cfg & a6xx.SP_CS_CONFIG_ENABLED: raise bad("SP_CS_CONFIG.ENABLED is clear")
    ntex, nsamp, nuav = (cfg >> 9) & 0xFF, (cfg >> 17) & 0x1F, (cfg >> 22) & 0x7F
    if (r(a6xx.REG_SP_MODE_CNTL) >> 1) & 3 != a6xx.ISAMMODE_CL or r(a6xx.REG_TPL1_MODE_CNTL) & 3 != a6xx.ISAMMODE_CL:
      raise bad("SP_MODE_CNTL / TPL1_MODE_CNTL ISAMMODE is not ISAMMODE_CL (OpenCL kernels sample in CL mode)")
    # the shader: loaded from SP_CS_BASE, SP_CS_INSTR_SIZE units of 128 bytes
    if (sh := self.state.get((a6xx.SB6_CS_SHADER, a6xx.ST6_SHADER))) is None: raise bad("no shader loaded")
    base, units = self.reg64(a6xx.REG_SP_CS_BASE), r(a6xx.REG_SP_CS_INSTR_SIZE)
    # the CP_LOAD_STATE6 is a preload of a prefix (NUM_UNIT has 10 bits); the SP fetches the whole shader from memory
    if sh[0] != base or len(sh[1]) > units * 128 or len(sh[1]) != min(units, (1 << NUM_UNIT_BITS) - 1) * 128:
      raise bad(f"shader loaded from {sh[0]:#x} ({len(sh[1])} bytes), but SP_CS_BASE is {base:#x} and "
                f"SP_CS_INSTR_SIZE {units} units")
    img = parse_image(self._read(base, units * 128, "the shader at SP_CS_BASE"))
    exp = img["regs"]
    cntl0, cntl1 = r(a6xx.REG_SP_CS_CNTL_0), r(a6xx.REG_SP_CS_CNTL_1)
    got = {"hregs": (cntl0 >> 1) & 0x3F, "fregs": (cntl0 >> 7) & 0x3F, "branchstack": (cntl0 >> 14) & 0x3F}
    if (want := {k: exp[k] for k in got}) != got: raise bad(f"SP_CS_CNTL_0 footprint {got}, the binary says {want}")
    if r(a6xx.REG_SP_CS_PROGRAM_COUNTER_OFFSET) != 0: raise bad("SP_CS_PROGRAM_COUNTER_OFFSET is not the binary's 0")
    if ((cntl1 & 0x1F) + 1) * 1024 < exp["shmem"]:
      raise bad(f"SP_CS_CNTL_1.SHARED_SIZE {cntl1 & 0x1F} gives less than the kernel's {exp['shmem']} bytes")
    # the const file
    if (cs := self.state.get((a6xx.SB6_CS_SHADER, a6xx.ST6_CONSTANTS))) is None: raise bad("no constants loaded")
    consts = cs[1]
    cc = r(a6xx.REG_SP_CS_CONST_CONFIG)
    constlen = (cc & 0xFF) * 4  # vec4s (CONSTLEN holds the count >> 2)
    if constlen == 0:
      # CONSTLEN 0 with ENABLED is what tinygrad 0.14's QCOM queue writes (it packs 256 unshifted, which overflows the
      # 8-bit field into ENABLED), and its kernels read their arguments on real a630s: the const file the shader sees
      # is then bounded by SP_CS_CNTL_1.CONSTANTRAMMODE only, which is what the mock checks
      constlen = CONST_RAM_VEC4[(cntl1 >> 5) & 3]
    if not cc & a6xx.SP_CS_CONST_CONFIG_ENABLED or constlen * 16 < len(consts):
      raise bad(f"SP_CS_CONST_CONFIG {cc:#x} (SP_CS_CNTL_1 {cntl1:#x}): constants disabled or a const file of "
                f"{constlen} vec4s, below the {len(consts) // 16} loaded")
    need = max([16] + [a["off"] + (8 if a["kind"] == "buf" else 4) for a in img["args"] if "off" in a])
    if len(consts) < need: raise bad(f"{len(consts)} bytes of constants loaded; the kernel's arguments need {need}")
    for value, off, size in img["imm"]:
      if int.from_bytes(consts[off:off + size], "little") != value:
        raise bad(f"immediate constant at byte {off} is {consts[off:off + size].hex()}, the binary says {value:#x}")
    # descriptors: counts in SP_CS_CONFIG, tables loaded from the bases the SP_CS_*_BASE registers name
    kinds = [a["kind"] for a in img["args"]]
    want_n = {"tex": kinds.count("tex"), "samp": exp["samplers"], "uav": kinds.count("uav")}
    if (ntex, nsamp, nuav) != (want_n["tex"], want_n["samp"], want_n["uav"]):
      raise bad(f"SP_CS_CONFIG NTEX/NSAMP/NUAV {ntex}/{nsamp}/{nuav}; the kernel has {want_n}")
    tables: dict[tuple[int, int], list[list[int]]] = {}
    for key, cnt, reg, dw in (((a6xx.SB6_CS_TEX, a6xx.ST6_CONSTANTS), ntex, a6xx.REG_SP_CS_TEXMEMOBJ_BASE, 16),
                              ((a6xx.SB6_CS_SHADER, a6xx.ST6_UAV), nuav, a6xx.REG_SP_CS_UAV_BASE, 16),
                              ((a6xx.SB6_CS_TEX, a6xx.ST6_SHADER), nsamp, a6xx.REG_SP_CS_SAMPLER_BASE, 4)):
      if not cnt:
        tables[key] = []
        continue
      if (t := self.state.get(key)) is None or len(t[1]) != cnt * dw * 4:
        raise bad(f"{cnt} descriptors of state {key} expected, {0 if t is None else len(t[1]) // (dw * 4)} loaded")
      if t[0] != self.reg64(reg): raise bad(f"{a6xx.REGISTERS[reg]} {self.reg64(reg):#x} is not where state {key} "
                                            f"was loaded from ({t[0]:#x})")
      tables[key] = [list(struct.unpack_from(f"<{dw}I", t[1], 4 * dw * k)) for k in range(cnt)]
    if nsamp:
      border = self.reg64(a6xx.REG_TPL1_CS_BORDER_COLOR_BASE)
      if any(self._read(border, 128, "TPL1_CS_BORDER_COLOR_BASE")):
        raise bad(f"the border color table at {border:#x} is not all zero (CLK_ADDRESS_CLAMP reads transparent black)")
    # the launch
    nd = [r(a6xx.REG_SP_CS_NDRANGE_0 + k) for k in range(7)]
    if nd[0] & 3 != 3: raise bad(f"SP_CS_NDRANGE_0.KERNELDIM {nd[0] & 3}; tiny launches 3 dimensions")
    local = ((nd[0] >> 2 & 0x3FF) + 1, (nd[0] >> 12 & 0x3FF) + 1, (nd[0] >> 22 & 0x3FF) + 1)
    gsize = (nd[1], nd[3], nd[5])
    if nd[2] or nd[4] or nd[6]: raise bad(f"global offsets {nd[2], nd[4], nd[6]}; tiny launches at 0")
    kg = (r(a6xx.REG_SP_CS_KERNEL_GROUP_X), r(a6xx.REG_SP_CS_KERNEL_GROUP_X + 1), r(a6xx.REG_SP_CS_KERNEL_GROUP_X + 2))
    if groups is not None and groups != kg: raise bad(f"CP_EXEC_CS groups {groups} differ from SP_CS_KERNEL_GROUP {kg}")
    if any(g * l != s or g == 0 for g, l, s in zip(kg, local, gsize)):
      raise bad(f"SP_CS_NDRANGE global size {gsize} is not the work-groups {kg} x local size {local}")
    if local[0] * local[1] * local[2] > 1024: raise bad(f"a work-group of {local} exceeds 1024 work-items")
    if (pvt := self.reg64(a6xx.REG_SP_CS_PVT_MEM_BASE)): self.mem.check(pvt, 1, "SP_CS_PVT_MEM_BASE")
    self.stats["dispatches"] += 1
    self.stats["texture_dispatches"] += ntex > 0
    tex, uav, samp = (tables[k] for k in ((a6xx.SB6_CS_TEX, a6xx.ST6_CONSTANTS), (a6xx.SB6_CS_SHADER, a6xx.ST6_UAV),
                                          (a6xx.SB6_CS_TEX, a6xx.ST6_SHADER)))
    # the objects the kernel can write: its buffer arguments and its storage images
    starts = {self.mem.alloc_start(struct.unpack_from("<Q", consts, a["off"])[0]) for a in img["args"]
              if a["kind"] == "buf"}
    starts |= {self.mem.alloc_start(d[4] | (d[5] & 0x1FFFF) << 32) for d in uav}
    d = Dispatch(img, consts, tex, uav, samp, gsize, local, self.mem.alloc_end)
    self.cache.dispatch(starts, lambda: self.runner.dispatch(d))
