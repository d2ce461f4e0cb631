"""The batched engine (emu/batch.py: many waves in lockstep as numpy columns) against the per-wave interpreter it
replaced (`Emulator.batched = False`): compiled kernels on MOCK+AMD (gfx1100 and gfx942) must leave bit-identical
buffers and count the same number of wave instructions; random straight-line programs of scalar and vector ALU ops
(special float values, partial EXEC, several waves with different SGPRs) must leave identical registers, SCC and
masks, or raise the same error."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_runtime_amd.emu import rdna3
from tiny_runtime_amd.emu.encode import Code, sop1, sop2, sopc, sopk, vop1, vop2, vop3, vopc, vopd
from tiny_runtime_amd.emu.rdna3 import EXEC_LO, LITERAL, VCC_LO, Emulator, Wave

M32 = 0xFFFFFFFF
SPECIAL = [0, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x807FFFFF,
           0x7F7FFFFF, 0x4B800000, 0xCF000000, 0x4F800000, 0x00800000, 0xFFFFFFFF, 0x7FFFFFFF, 1, 31, 32, 0x1000]


def _nan32(v: np.ndarray) -> np.ndarray: return (v & 0x7FFFFFFF) > 0x7F800000


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
  """Equal, except that where both are float32 NaNs their payloads may differ (see emu/batch.py's docstring)."""
  got, want = np.asarray(got, np.uint32), np.asarray(want, np.uint32)
  return bool(((got == want) | (_nan32(got) & _nan32(want))).all())


# ***** compiled kernels on the mock, both engines *****
needs_lld = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")


def _kernels():
  from tiny_runtime_amd.emu.bench import elementwise, matmul, reduction
  from tiny_uop import KernelInfo, Ops, UOp, dtypes
  from tiny_uop.uop import AxisType
  out = [("elementwise", elementwise(1000), dtypes.float, 1000, True), ("matmul", matmul(16), dtypes.float, 256, True),
         ("matmul64", matmul(64), dtypes.float, 4096, True),  # gfx942 spills to scratch here
         ("sum", reduction(4096), dtypes.float, 4096, True)]
  for name, fn, dt in [("where_exp2", lambda a, b: (a < b).where(a.exp2(), b.sqrt()), dtypes.float),
                       ("div_max", lambda a, b: (a / b).maximum(a * b - 1), dtypes.float),
                       ("int_ops", lambda a, b: (a * b) // (b + 3) + (a % 7) - (a ^ b), dtypes.int),
                       ("shifts", lambda a, b: (a << 3) + (b >> 2) + (a & b | 5), dtypes.uint32),
                       ("half", lambda a, b: a * b + a.maximum(b), dtypes.half),
                       ("casts", lambda a, b: (a.cast(dtypes.int) + b.cast(dtypes.int)).cast(dtypes.float),
                        dtypes.float),
                       ("double", lambda a, b: a / b + a * b, dtypes.double)]:
    c, a, b = (UOp(Ops.PARAM, dt.ptr(300), arg=i) for i in range(3))
    i = UOp.range(300, 0)
    out.append((name, c.index(i).store(fn(a.index(i).load(), b.index(i).load())).sink(arg=KernelInfo(name)), dt, 300,
                name != "casts"))  # float -> int of inf: see rdna3._cvt_i32
  c, a, _ = (UOp(Ops.PARAM, dtypes.float.ptr(1 if i == 0 else 777), arg=i) for i in range(3))
  k = UOp.range(777, 0, AxisType.REDUCE)
  mx = UOp(Ops.REDUCE, dtypes.float, (a.index(k).load(), k), Ops.MAX)
  out.append(("max_odd", c.index(UOp.const(dtypes.int, 0)).store(mx).sink(arg=KernelInfo("max_odd")), dtypes.float, 777,
              True))
  return out


def _inputs(dt, n: int, rng: np.random.Generator, specials: bool) -> list[np.ndarray]:
  """Two input arrays; floats include 0, -0, +-inf, NaN and a subnormal when `specials`."""
  from tiny_uop import dtypes
  npdt = {dtypes.float: np.float32, dtypes.int: np.int32, dtypes.uint32: np.uint32, dtypes.half: np.float16,
          dtypes.double: np.float64}[dt]
  out = []
  for _ in range(2):
    if npdt in (np.int32, np.uint32):
      x = rng.integers(-1000 if npdt is np.int32 else 0, 1000, n).astype(npdt)
    else:
      x = rng.standard_normal(n).astype(npdt) * 3
      if specials: x[rng.integers(0, n, max(1, n // 20))] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40], npdt)[
        rng.integers(0, 6, max(1, n // 20))]
    out.append(x)
  return out


def _run_kernel(arch: str, ast, dt, n: int, specials: bool, rng: np.random.Generator) -> tuple[list[bytes], int]:
  from tiny_codegen import get_program
  from tiny_codegen.opt import Kernel, hand_coded_optimizations
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  from tiny_runtime_amd.emu.bench import _DEVS, bench  # noqa: F401 (bench opens the device for `arch`)
  from tiny_uop.helpers import Context
  from tiny_runtime_amd.device import AMDDevice
  if (dev := _DEVS.get(arch)) is None:
    with Context(DEV=f"MOCK+AMD:LLVM:{arch}"): dev = _DEVS[arch] = AMDDevice("MOCK+AMD")
  ren = AMDGPURenderer(arch)
  spec = get_program(hand_coded_optimizations(Kernel(ast, ren)).get_optimized_ast(), ren)
  itemsize = {2: 2, 4: 4, 8: 8}[dt.itemsize]
  bufs = [dev.allocator.alloc(itemsize * n) for _ in range(3)]
  for buf, arr in zip(bufs[1:], _inputs(dt, n, rng, specials)): dev.allocator._copyin(buf, memoryview(arr.tobytes()))
  dev.allocator._copyin(bufs[0], memoryview(bytes(itemsize * n)))
  prg = dev.get_program(spec.name, spec.lib)
  emu = dev._driver.emu
  s0 = emu.steps
  prg(*bufs, global_size=spec.global_size, local_size=spec.local_size, vals=(), wait=True)
  outs = []
  for buf in bufs:
    host = memoryview(bytearray(itemsize * n))
    dev.allocator._copyout(host, buf)
    outs.append(bytes(host))
  return outs, emu.steps - s0


@needs_lld
@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
@pytest.mark.parametrize("case", _kernels(), ids=lambda c: c[0])
def test_kernels_match_the_per_wave_interpreter(case, arch, monkeypatch):
  name, ast, dt, n, specials = case
  got, steps = _run_kernel(arch, ast, dt, n, specials, np.random.default_rng(1))
  monkeypatch.setattr(Emulator, "batched", False)
  want, ref_steps = _run_kernel(arch, ast, dt, n, specials, np.random.default_rng(1))
  assert steps == ref_steps, f"{name}: {steps} wave instructions batched, {ref_steps} per wave"
  for g, w in zip(got, want):
    if dt.itemsize == 4: assert same_bits(np.frombuffer(g, np.uint32), np.frombuffer(w, np.uint32)), name
    else: assert g == w, name


# ***** random ALU programs on both engines *****
def _operand(rng: np.random.Generator, vgpr: bool = True) -> tuple[int, list[int]]:
  """(operand code, the literal dword it needs)."""
  k = rng.integers(0, 10)
  if k < 5 and vgpr: return 256 + int(rng.integers(0, 10)), []
  if k < 7: return int(rng.integers(0, 16)), []
  if k == 7: return int(rng.choice([128, 129, 140, 192, 193, 200, 208, *range(240, 249)])), []
  if k == 8: return LITERAL, [int(rng.choice(SPECIAL))]
  return int(rng.choice([VCC_LO, EXEC_LO, 253])), []


VOP2_OPS = [*rdna3.VOP2, 1, 43, 44, 45, 32, 33, 34]
VOP1_OPS = [op for op in rdna3.VOP1 if op not in (2,)]
VOP3_OPS = [*rdna3.VOP3, 0x213, 0x101, 0x300, 0x301, 0x120, 0x121, 0x122, 0x2FE, 0x33C, 0x33D, 0x33E, 0x360, 0x2FC,
            0x237, 0x227, *(0x100 + o for o in rdna3.VOP2), *(0x180 + o for o in rdna3.VOP1)]
VOPC_OPS = [*range(0x10, 0x20), *range(0x40, 0x50), *range(0x90, 0xA0), *range(0xC0, 0xD0), 0x7E]
SOP2_OPS = [0, 1, 2, 3, 4, 5, 8, 10, 12, 18, 19, 20, 21, 22, 24, 26, 28, 30, 32, 34, 36, 38, 42, 44, 45, 48, 50, 51,
            52, 14, 15, 9, 11, 23, 25, 27]


def _instruction(rng: np.random.Generator) -> list[int]:
  kind = rng.choice(["vop2", "vop1", "vop3", "vopc", "vopd", "sop2", "sop1", "sopk", "sopc"],
                    p=[0.2, 0.1, 0.25, 0.12, 0.08, 0.12, 0.05, 0.04, 0.04])
  v = lambda: int(rng.integers(0, 10))  # noqa: E731
  if kind == "vop2":
    op = int(rng.choice(VOP2_OPS))
    s0, lit = _operand(rng)
    if op in (44, 45) and not lit: lit = [int(rng.choice(SPECIAL))]
    return vop2(op, v(), s0, v()) + lit
  if kind == "vop1":
    s0, lit = _operand(rng)
    return vop1(int(rng.choice(VOP1_OPS)), v(), s0) + lit
  if kind == "vop3":
    op = int(rng.choice(VOP3_OPS))
    srcs, lits = zip(*(_operand(rng) for _ in range(3)))
    lit = next((x for x in lits if x), [])
    srcs = [s for s in srcs]
    for i in range(3):  # one literal at most; a mask operand (src2 of cndmask / carry-in) is an SGPR
      if srcs[i] == LITERAL and (i > 0 and LITERAL in srcs[:i]): srcs[i] = 256 + v()
      if i == 2 and op in (0x101, 0x120, 0x121, 0x122): srcs[i] = int(rng.choice([VCC_LO, 4, 6, EXEC_LO]))
    if op == 0x360: srcs[0] = 256 + v()
    lit = lit if LITERAL in srcs else []
    mods = int(rng.choice([0, 0, 0, 1, 2, 4, 3])) if op in (0x101, 0x213, 0x227, 0x237, 0x2FC, 0x31C) or \
      0x103 <= op <= 0x110 else 0
    sdst = int(rng.choice([VCC_LO, 4, 6, 124]))
    d = int(rng.integers(0, 16)) if op == 0x360 else v()
    w = vop3(op, d, *srcs, sdst=sdst if op in rdna3.VOP3SD else 0, abs_=0 if op in rdna3.VOP3SD else mods & 1,
             neg=mods >> 1)
    return w + list(lit)
  if kind == "vopc":
    op = int(rng.choice(VOPC_OPS))
    s0, lit = _operand(rng)
    if rng.integers(0, 2): return vopc(op, s0, v()) + lit
    s1, lit1 = _operand(rng)
    if lit and lit1: s1, lit1 = 256 + v(), []
    mods = int(rng.integers(0, 4)), int(rng.integers(0, 4))
    return vop3(op, int(rng.choice([VCC_LO, 2, 8])), s0, s1, abs_=mods[0], neg=mods[1]) + lit + lit1
  if kind == "vopd":
    opx = int(rng.choice([0, 3, 4, 5, 6, 8, 9, 10, 11]))  # OPX is 4 bits; OPY (5 bits) also has the integer ops
    opy = int(rng.choice([0, 3, 4, 5, 6, 8, 9, 10, 11, 16, 17, 18]))
    dx = 2 * int(rng.integers(0, 5))
    s0x, litx = _operand(rng)
    s0y, lity = _operand(rng)
    if litx and lity: s0y, lity = 256 + v(), []
    return vopd(opx, opy, dx, 2 * int(rng.integers(0, 5)) + 1, s0x, v(), s0y, v()) + litx + lity
  s = lambda: int(rng.integers(0, 16))  # noqa: E731
  if kind == "sop2":
    a, la = _operand(rng, vgpr=False)
    b, lb = _operand(rng, vgpr=False)
    if la and lb: b, lb = s(), []
    op = int(rng.choice(SOP2_OPS))
    if op in (9, 11, 23, 25, 27): a, la = 2 * int(rng.integers(0, 8)), []
    if op in (23, 25, 27): b, lb = int(rng.choice([0, 2, VCC_LO, EXEC_LO])), []
    d = 2 * int(rng.integers(0, 8)) if op in (9, 11, 23, 25, 27) else int(rng.choice([s(), s(), VCC_LO, EXEC_LO]))
    return sop2(op, d, a, b) + la + lb
  if kind == "sop1":
    a, la = _operand(rng, vgpr=False)
    op = int(rng.choice([0, 30, 32, 34, 36, 48]))
    return sop1(op, s(), a) + la
  if kind == "sopk": return sopk(int(rng.choice([0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])), s(),
                                 int(rng.integers(0, 1 << 16)))
  a, la = _operand(rng, vgpr=False)
  b, lb = _operand(rng, vgpr=False)
  if la and lb: b, lb = s(), []
  return sopc(int(rng.integers(0, 12)), a, b) + la + lb


def _waves(rng: np.random.Generator, n: int) -> list[Wave]:
  waves = []
  for _ in range(n):
    w = Wave(lds=bytearray(0))
    for r in range(10): w.vgpr[r] = [int(x) for x in rng.choice(SPECIAL + list(rng.integers(0, 1 << 32, 20)), 32)]
    for r in range(16): w.sgpr[r] = int(rng.choice(SPECIAL + list(rng.integers(0, 1 << 32, 4))))
    w.sgpr[VCC_LO] = int(rng.integers(0, 1 << 32))
    w.sgpr[EXEC_LO] = int(rng.choice([M32, M32, int(rng.integers(0, 1 << 32)), 0xFFFF, 1]))
    w.scc = int(rng.integers(0, 2))
    waves.append(w)
  return waves


def _outcome(code: Code, waves: list[Wave], batched: bool) -> tuple[str | None, list[Wave]]:
  waves = copy.deepcopy(waves)
  emu = Emulator()
  emu.batched = batched
  try: emu.run_group(waves, code.addr) if len(waves) > 1 else emu.run(waves[0], code.addr)
  except (rdna3.UnsupportedInstruction, RuntimeError, IndexError, OverflowError, ValueError, KeyError) as e:
    return f"{type(e).__name__}: {e}", waves
  return None, waves


@pytest.mark.parametrize("seed", range(40))
def test_random_alu_programs_match_the_per_wave_interpreter(seed):
  rng = np.random.default_rng(seed)
  for trial in range(6):
    prog = [_instruction(rng) for _ in range(int(rng.integers(1, 12)))]
    code, waves = Code(*prog), _waves(rng, int(rng.choice([1, 1, 2, 3])))
    err_ref, ref = _outcome(code, waves, False)
    err, got = _outcome(code, waves, True)
    where = f"seed {seed} trial {trial}: {[hex(x) for p in prog for x in p]}"
    assert err == err_ref, where
    if err is not None: continue
    for i, (g, w) in enumerate(zip(got, ref)):
      diff = [(r, hex(a), hex(b)) for r, (a, b) in enumerate(zip(g.sgpr, w.sgpr)) if a != b]
      assert not diff, f"{where} wave {i} sgpr (register, batched, per wave): {diff}"
      assert g.scc == w.scc, where
      for r in range(16):
        if r in w.vgpr or r in g.vgpr:
          assert same_bits(g.vgpr[r], w.vgpr[r]), f"{where} wave {i} v{r}: {g.vgpr[r]} != {w.vgpr[r]}"


# ***** 16-bit (true16 halves), 64-bit compares and the rarer scalar ops, on both engines *****
VOPC_16 = [*range(0x10), *range(0x30, 0x40), 0x7D]
VOPC_64 = [*range(0x20, 0x30), *range(0x50, 0x60)]


def _nan16(v: np.ndarray) -> np.ndarray: return (v & 0x7FFF) > 0x7C00


def same_halves(got: np.ndarray, want: np.ndarray) -> bool:
  """`same_bits`, and where a 16-bit half differs it must be a half NaN in both: the payload and sign a float16 op
  gives when both operands are NaN are not fixed (the per-wave tables compute in Python floats, and CPython's float
  add takes the NaN of either operand depending on whether its interpreter has specialized the call site)."""
  got, want = np.asarray(got, np.uint32), np.asarray(want, np.uint32)
  halves = [((got >> s) & 0xFFFF, (want >> s) & 0xFFFF) for s in (0, 16)]
  ok = np.logical_and.reduce([(g == w) | (_nan16(g) & _nan16(w)) for g, w in halves])
  return bool(((got == want) | (_nan32(got) & _nan32(want)) | ok).all())


def _wide_instruction(rng: np.random.Generator) -> list[int]:
  """One of the ops the batched engine does on columns with the per-wave tables' functions: VOP1/VOP2/VOP3 16-bit
  ops on VGPR halves (bit 7 of a VGPR field, op_sel in VOP3), 16- and 64-bit compares (VOPC and VOP3, v_cmpx too),
  s_bfe_i32, s_mul_hi_i32, s_sext_i32_i8/i16, s_cmp_eq/lg_u64."""
  kind = rng.choice(["vop2", "vop1", "vop3", "vopc16", "vopc64", "salu"], p=[0.2, 0.15, 0.25, 0.15, 0.15, 0.1])
  v = lambda: int(rng.integers(0, 10))  # noqa: E731
  h = lambda: v() + 128 * int(rng.integers(0, 2))  # noqa: E731 (a VGPR's low or high half)

  def src16() -> tuple[int, list[int]]:
    s0, lit = _operand(rng)
    return (256 + h(), []) if s0 >= 256 else (s0, lit)
  if kind == "vop2":
    s0, lit = src16()
    return vop2(int(rng.choice(list(rdna3.VOP2_16))), h(), s0, h()) + lit
  if kind == "vop1":
    s0, lit = src16()
    return vop1(int(rng.choice([*rdna3.VOP1_16, 28])), h(), s0) + lit
  if kind in ("vopc16", "vopc64"):
    op = int(rng.choice(VOPC_16 if kind == "vopc16" else VOPC_64)) | int(rng.choice([0, 0x80]))
    if kind == "vopc16": s0, lit = src16()
    else:
      s0, lit = _operand(rng)
      if s0 >= 256: s0 = 256 + int(rng.integers(0, 9))  # a VGPR pair within v0..v9
      elif s0 < 16: s0 &= ~1  # an SGPR pair
    s1 = (128 * int(rng.integers(0, 2)) if kind == "vopc16" else 0) + int(rng.integers(0, 9))
    if rng.integers(0, 2): return vopc(op, s0, s1) + lit
    mods = int(rng.integers(0, 4)), int(rng.integers(0, 4))
    if kind == "vopc16":
      w = vop3(op, int(rng.choice([VCC_LO, 2, 8])), s0 if s0 < 256 else 256 + (s0 & 0x7F), 256 + (s1 & 0x7F),
               abs_=mods[0], neg=mods[1])
      return [w[0] | int(rng.integers(0, 4)) << 11, w[1]] + lit  # op_sel: the high half of src0 / src1
    return vop3(op, int(rng.choice([VCC_LO, 2, 8])), s0, 256 + s1, abs_=mods[0], neg=mods[1]) + lit
  if kind == "vop3":
    op = int(rng.choice([o for o in rdna3.VOP3_16 if o not in (0x136, 0x25D)]))
    srcs, lits = zip(*(_operand(rng) for _ in range(3)))
    srcs = [256 + v() if s >= 256 else s for s in srcs]
    for i in range(1, 3):
      if srcs[i] == LITERAL and LITERAL in srcs[:i]: srcs[i] = 256 + v()
    lit = next((x for x in lits if x), []) if LITERAL in srcs else []
    fp = rdna3.VOP3_16[op][2]
    w = vop3(op, v(), *srcs, abs_=int(rng.integers(0, 8)) if fp else 0, neg=int(rng.integers(0, 8)) if fp else 0)
    return [w[0] | int(rng.integers(0, 16)) << 11, w[1]] + list(lit)
  s = lambda: int(rng.integers(0, 16))  # noqa: E731
  which = int(rng.integers(0, 3))
  a, la = _operand(rng, vgpr=False)
  if which == 0:
    b, lb = _operand(rng, vgpr=False)
    if la and lb: b, lb = s(), []
    return sop2(int(rng.choice([39, 46])), s(), a, b) + la + lb
  if which == 1: return sop1(int(rng.choice([14, 15])), s(), a) + la
  return sopc(int(rng.choice([16, 17])), 2 * int(rng.integers(0, 8)), int(rng.choice([0, 2, 4, VCC_LO, EXEC_LO])))


@pytest.mark.parametrize("seed", range(30))
def test_random_16_and_64_bit_programs_match_the_per_wave_interpreter(seed):
  rng = np.random.default_rng(1000 + seed)
  for trial in range(6):
    n = int(rng.integers(1, 10))
    prog = [_wide_instruction(rng) if rng.integers(0, 4) else _instruction(rng) for _ in range(n)]
    code, waves = Code(*prog), _waves(rng, int(rng.choice([1, 2, 3])))
    err_ref, ref = _outcome(code, waves, False)
    err, got = _outcome(code, waves, True)
    where = f"seed {seed} trial {trial}: {[hex(x) for p in prog for x in p]}"
    assert err == err_ref, where
    if err is not None: continue
    for i, (g, w) in enumerate(zip(got, ref)):
      assert g.sgpr == w.sgpr and g.scc == w.scc, f"{where} wave {i}"
      for r in range(16):
        if r in w.vgpr or r in g.vgpr:
          assert same_halves(g.vgpr[r], w.vgpr[r]), f"{where} wave {i} v{r}: {g.vgpr[r]} != {w.vgpr[r]}"
