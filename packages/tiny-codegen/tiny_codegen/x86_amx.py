"""AMX bfloat16 matrix products on x86-64 CPUs that run them (issue #39): a GEMM kernel's LLVM IR built on the tile
instructions, and this process's permission to use the tile state.

Reached from `Tensor.dot` (bfloat16 2-D operands on the CPU where `request_tile_state()` holds and 32 divides M, N
and K): `dot` packs B as below and sums `A.float() * Bp.float()` over (k/2, 2), cast to bfloat16, in one kernel,
and `tiny_codegen.program` hands a kernel AST that `match_matmul` recognises to this kernel instead of lowering it.
`bench/bench_bf16.py` measures it beside torch's. Why AMX and not `vdpbf16ps`: on the Sapphire Rapids VM this
project measures on, a `vdpbf16ps zmm` (64 flops) issues at ~0.2x the rate of a `vfmadd231ps zmm` (32 flops), so
an AVX512-BF16 kernel does ~0.45x the float32 FMA kernel's flops (bench/README.md, "bfloat16: AMX"); only the
tiles reach oneDNN's figures.

The kernel, `void <name>(float *out, uint16 *a, uint16 *bp, i32 core_id)`, one call per thread `core_id` of
`threads` (the CPU runtime's convention), computes rows [core_id * M/threads, (core_id+1) * M/threads) of
out = A @ B, summed in float32 (each `tdpbf16ps` adds pairs of exact bfloat16 products):
- `a`: A (M, K) bfloat16 bits, row-major;
- `bp`: B (K, N) packed as (N/16, K/2, 16, 2): panels of 16 columns, in each the pairs of consecutive k of one column
  side by side (the B operand layout of TDPBF16PS, Intel SDM vol. 2), so one B tile is 1 KB contiguous;
- `out`: (M, N) float32, row-major.
Tiles (AMX palette 1: 8 tiles of at most 16 rows x 64 bytes): 2 A tiles (16 rows x 32 k) and 2 B tiles (16 k-pairs x
16 columns) feed 4 float32 C tiles, a 32 x 32 output block that stays in the tiles for the whole K loop. LLVM's tile
configuration pass writes the `ldtilecfg` (the shapes are constants here).
"""
from __future__ import annotations

import ctypes
import functools
import platform

from tiny_uop.dtype import PtrDType, dtypes
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen import cpu_probe

__all__ = ["TILE_ROWS", "TILE_BYTES", "BLOCK", "amx_bf16_matmul_ir", "request_tile_state", "fits",
           "match_matmul"]

TILE_ROWS, TILE_BYTES = 16, 64
"""AMX palette 1: a tile holds at most 16 rows of 64 bytes (Intel SDM vol. 1, "Intel AMX")."""
K_STEP = TILE_BYTES // 2
"""bfloat16 values of k one A tile row holds (32)."""
BLOCK = 2 * TILE_ROWS
"""The output block one thread keeps in its 4 C tiles: BLOCK x BLOCK (32 x 32)."""

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # asm/unistd_64.h, asm/prctl.h


def _check_shape(m: int, n: int, k: int, threads: int) -> None:
  for name, v in (("M", m), ("N", n), ("K", k), ("threads", threads)):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"amx_bf16_matmul_ir: {name} must be a positive int, got {v!r}")
  if m % (BLOCK * threads): raise ValueError(f"amx_bf16_matmul_ir: M={m} must be a multiple of {BLOCK} x threads "
                                             f"({BLOCK * threads} for threads={threads})")
  if n % BLOCK: raise ValueError(f"amx_bf16_matmul_ir: N={n} must be a multiple of {BLOCK}")
  if k % K_STEP: raise ValueError(f"amx_bf16_matmul_ir: K={k} must be a multiple of {K_STEP}")
  if m * k >= 2 ** 31 or m * n >= 2 ** 31 or n * k >= 2 ** 31:  # the element offsets are i32
    raise ValueError(f"amx_bf16_matmul_ir: {m}x{k} @ {k}x{n} has an operand of 2**31 or more elements; valid: fewer")


def amx_bf16_matmul_ir(m: int, n: int, k: int, threads: int = 1, name: str = "amx_bf16_matmul",
                       out_bf16: bool = False) -> str:
  """The LLVM IR module of the tile GEMM described in the module docstring, for A (m, k) @ B (k, n) split into
  `threads` row shares. `out_bf16`: `out` is bfloat16 (uint16 bits), each float32 sum rounded as tiny's cast rounds
  (to nearest even, NaN -> 0x7FC0, denormals kept), through a 1 KB stack buffer per C tile. ValueError for a shape
  the blocks don't divide (M a multiple of 32 x threads, N of 32, K of 32). Only run what it compiles to where
  `request_tile_state()` returned True.

  >>> "tdpbf16ps" in amx_bf16_matmul_ir(64, 32, 32, threads=2)
  True
  """
  _check_shape(m, n, k, threads)
  rows = m // threads
  tt = f"i16 {TILE_ROWS}, i16 {TILE_BYTES}"  # every tile's shape: 16 rows x 64 bytes
  ln = [
    "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
    "declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
    "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
    "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)",
    f"define void @{name}(ptr noalias %out, ptr noalias %a, ptr noalias %bp, i32 %core_id) #0 {{",
    "entry:", "  %cbuf = alloca [256 x float], align 64", f"  %r0 = mul i32 %core_id, {rows}",
    "  br label %cb.head",
    # column blocks outside, row blocks inside: a B panel pair (2 x K x 32 bytes) is reused by every row block
    "cb.head:", "  %cb = phi i32 [0, %entry], [%cb.next, %rb.exit]", f"  %cb.ok = icmp slt i32 %cb, {n // BLOCK}",
    "  br i1 %cb.ok, label %rb.head, label %done",
    "rb.head:", "  %rb = phi i32 [0, %cb.head], [%rb.next, %k.exit]", f"  %rb.ok = icmp slt i32 %rb, {rows // BLOCK}",
    "  br i1 %rb.ok, label %k.pre, label %rb.exit",
    "k.pre:", f"  %rbr = mul i32 %rb, {BLOCK}", "  %row0 = add i32 %r0, %rbr"]
  ln += [f"  %z{t} = call x86_amx @llvm.x86.tilezero.internal({tt})" for t in range(4)]
  ln += ["  br label %k.head", "k.head:", "  %kb = phi i32 [0, %k.pre], [%kb.next, %k.body]"]
  ln += [f"  %c{t} = phi x86_amx [%z{t}, %k.pre], [%d{t}, %k.body]" for t in range(4)]
  ln += [f"  %k.ok = icmp slt i32 %kb, {k // K_STEP}", "  br i1 %k.ok, label %k.body, label %k.exit", "k.body:",
         f"  %ak = mul i32 %kb, {K_STEP}"]
  for i in range(2):  # A tile i: rows row0 + 16i .., k kb*32 .. +32, row stride K*2 bytes
    ln += [f"  %ar{i} = add i32 %row0, {TILE_ROWS * i}", f"  %arow{i} = mul i32 %ar{i}, {k}",
           f"  %ao{i} = add i32 %arow{i}, %ak", f"  %ap{i} = getelementptr inbounds i16, ptr %a, i32 %ao{i}",
           f"  %A{i} = call x86_amx @llvm.x86.tileloadd64.internal({tt}, ptr %ap{i}, i64 {k * 2})"]
  for j in range(2):  # B tile j: panel 2cb + j (K*16 values), k-pairs kb*16 .. +16 (512 values), rows of 64 bytes
    ln += [f"  %pn{j} = mul i32 %cb, 2", f"  %pj{j} = add i32 %pn{j}, {j}", f"  %po{j} = mul i32 %pj{j}, {k * 16}",
           f"  %bk{j} = mul i32 %kb, {K_STEP * 16}", f"  %bo{j} = add i32 %po{j}, %bk{j}",
           f"  %bptr{j} = getelementptr inbounds i16, ptr %bp, i32 %bo{j}",
           f"  %B{j} = call x86_amx @llvm.x86.tileloadd64.internal({tt}, ptr %bptr{j}, i64 {TILE_BYTES})"]
  for t in range(4):
    ln.append(f"  %d{t} = call x86_amx @llvm.x86.tdpbf16ps.internal({tt}, i16 {TILE_BYTES}, x86_amx %c{t}, "
              f"x86_amx %A{t // 2}, x86_amx %B{t % 2})")
  ln += ["  %kb.next = add i32 %kb, 1", "  br label %k.head", "k.exit:"]
  for t in range(4):  # C tile t = (row half t//2, column half t%2), row stride N*4 bytes
    ln += [f"  %or{t} = add i32 %row0, {TILE_ROWS * (t // 2)}", f"  %orow{t} = mul i32 %or{t}, {n}",
           f"  %ocb{t} = mul i32 %cb, {BLOCK}", f"  %oc{t} = add i32 %ocb{t}, {TILE_ROWS * (t % 2)}",
           f"  %oi{t} = add i32 %orow{t}, %oc{t}"]
    if out_bf16: ln += _bf16_epilogue(t, n, tt)
    else: ln += [f"  %op{t} = getelementptr inbounds float, ptr %out, i32 %oi{t}",
                 f"  call void @llvm.x86.tilestored64.internal({tt}, ptr %op{t}, i64 {n * 4}, x86_amx %c{t})"]
  ln += ["  %rb.next = add i32 %rb, 1", "  br label %rb.head", "rb.exit:", "  %cb.next = add i32 %cb, 1",
         "  br label %cb.head", "done:", "  ret void", "}",
         'attributes #0 = { nounwind "target-features"="+amx-tile,+amx-bf16" }']
  return "\n".join(ln) + "\n"


def _splat(v: int) -> str: return "<i32 " + ", i32 ".join([str(v)] * 16) + ">"


def _bf16_epilogue(t: int, n: int, tt: str) -> list[str]:
  """C tile t stored to the stack buffer, then each of its 16 rows rounded to bfloat16 bits and stored at out +
  %oi{t} + row * n: (bits + 0x7FFF + (bits >> 16 & 1)) >> 16 (ties to even; denormals round like any value), NaN ->
  0x7FC0."""
  ln = [f"  call void @llvm.x86.tilestored64.internal({tt}, ptr %cbuf, i64 {TILE_BYTES}, x86_amx %c{t})"]
  for r in range(TILE_ROWS):
    v = f"%e{t}_{r}"
    ln += [f"  {v}p = getelementptr inbounds float, ptr %cbuf, i32 {r * 16}",
           f"  {v}f = load <16 x float>, ptr {v}p, align 64", f"  {v}n = fcmp uno <16 x float> {v}f, {v}f",
           f"  {v}b = bitcast <16 x float> {v}f to <16 x i32>", f"  {v}s = lshr <16 x i32> {v}b, {_splat(16)}",
           f"  {v}o = and <16 x i32> {v}s, {_splat(1)}", f"  {v}a = add <16 x i32> {v}o, {_splat(0x7FFF)}",
           f"  {v}c = add <16 x i32> {v}b, {v}a", f"  {v}h = lshr <16 x i32> {v}c, {_splat(16)}",
           f"  {v}q = select <16 x i1> {v}n, <16 x i32> {_splat(0x7FC0)}, <16 x i32> {v}h",
           f"  {v}t = trunc <16 x i32> {v}q to <16 x i16>", f"  {v}i = add i32 %oi{t}, {r * n}",
           f"  {v}w = getelementptr inbounds i16, ptr %out, i32 {v}i", f"  store <16 x i16> {v}t, ptr {v}w, align 2"]
  return ln


def request_tile_state() -> bool:
  """Whether this process may run AMX tile instructions: `cpu_probe.executes("amx_bf16")` (a child ran them; False
  at once where the flags don't list AMX or `TINY_CPU_PROBE=0`), then Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM,
  XFEATURE_XTILEDATA)` for this process (without it the first tile load raises SIGILL). False means: don't run
  `amx_bf16_matmul_ir`'s code here."""
  return cpu_probe.executes("amx_bf16") and _arch_prctl_tiles()


@functools.cache
def _arch_prctl_tiles() -> bool:
  """Ask Linux for the AMX tile data state (once per process: the permission lasts the process's life)."""
  if platform.system() != "Linux": return False
  libc = ctypes.CDLL(None, use_errno=True)
  return int(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)) == 0


def fits(m: int, n: int, k: int) -> bool:
  """Whether the kernel's blocks divide an (m, k) @ (k, n) product (M, N and K multiples of 32) and its i32 offsets
  hold it: the shapes `Tensor.dot` sends here."""
  return all(isinstance(v, int) and v > 0 and v % BLOCK == 0 for v in (m, n, k)) and \
    max(m * k, m * n, n * k) < 2 ** 31


def _affine_strides(idx: UOp, rngs: list[UOp]) -> dict[UOp, int] | None:
  """{range: stride} of an index made of ADD, MUL by a constant, RANGE and CONST only, whose value at all ranges 0 is 0;
  None for any other index (then it is no layout this kernel reads)."""
  for u in idx.toposort():
    if u.op not in (Ops.ADD, Ops.MUL, Ops.CONST, Ops.RANGE): return None
    if u.op is Ops.MUL and not any(s.op is Ops.CONST for s in u.src): return None
  zero = {r: UOp.const(r.dtype, 0) for r in rngs}
  base = idx.substitute(zero).simplify() if rngs else idx
  if base.op is not Ops.CONST or base.arg != 0: return None
  out: dict[UOp, int] = {}
  for r in rngs:
    one = idx.substitute({**zero, r: UOp.const(r.dtype, 1)}).simplify()
    if one.op is not Ops.CONST: return None
    out[r] = int(one.arg)
  return out


def _bf16_load(x: UOp) -> tuple[UOp, UOp] | None:
  """(PARAM, index) of CAST(float32, LOAD(INDEX(PARAM bf16, index))), else None."""
  if x.op is not Ops.CAST or x.dtype != dtypes.float32: return None
  ld = x.src[0]
  if ld.op is not Ops.LOAD or ld.dtype != dtypes.bfloat16 or len(ld.src) != 1: return None
  ix = ld.src[0]
  if ix.op is not Ops.INDEX or len(ix.src) != 2 or ix.src[0].op is not Ops.PARAM: return None
  return ix.src[0], ix.src[1]


def match_matmul(ast: UOp) -> tuple[int, int, int, bool] | None:
  """(M, N, K, out_bf16) when kernel AST `ast` is exactly what this kernel computes, with PARAM 0 the out (M, N):
  float32, or bfloat16 when the STORE holds a CAST of the sum to bfloat16 (out_bf16 True), PARAM 1
  A (M, K) bfloat16 and PARAM 2 B packed (N/16, K/2, 16, 2) bfloat16: one STORE of REDUCE-ADD over (k/2, 2) of the
  float32 casts' product, every index affine in five ranges whose strides are the layouts' (checked per range, so
  the match is exact, not sampled), and `fits(M, N, K)`. None for anything else (it is lowered as usual)."""
  if ast.op is not Ops.SINK or len(ast.src) != 1 or (st := ast.src[0]).op is not Ops.STORE or len(st.src) != 2:
    return None
  oix, red = st.src
  out_bf16 = red.op is Ops.CAST and red.dtype == dtypes.bfloat16
  if out_bf16: red = red.src[0]
  if oix.op is not Ops.INDEX or len(oix.src) != 2 or oix.src[0].op is not Ops.PARAM: return None
  if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or red.dtype != dtypes.float32 or len(red.src) != 3: return None
  if (mul := red.src[0]).op is not Ops.MUL or (la := _bf16_load(mul.src[0])) is None or \
     (lb := _bf16_load(mul.src[1])) is None: return None
  params = (oix.src[0], la[0], lb[0])
  if [p.arg for p in params] != [0, 1, 2] or not all(isinstance(p.dtype, PtrDType) for p in params) or \
     params[0].dtype.base != (dtypes.bfloat16 if out_bf16 else dtypes.float32): return None
  rk2, rj = red.src[1], red.src[2]
  outs = sorted({u for u in oix.src[1].toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
  rngs = [*outs, rk2, rj]
  if len(outs) != 3 or any(r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST for r in rngs) or \
     any(r.arg[1] is not AxisType.LOOP for r in outs): return None
  so, sa, sb = (_affine_strides(i, rngs) for i in (oix.src[1], la[1], lb[1]))
  if so is None or sa is None or sb is None: return None
  rm, rnp, rp = outs
  size = {r: int(r.src[0].arg) for r in rngs}
  m, n, k = size[rm], 16 * size[rnp], 2 * size[rk2]
  want = {rm: (n, k, 0), rnp: (16, 0, 16 * k), rp: (1, 0, 2), rk2: (0, 2, 32), rj: (0, 1, 1)}
  if size[rp] != 16 or size[rj] != 2 or any((so[r], sa[r], sb[r]) != w for r, w in want.items()): return None
  if not fits(m, n, k): return None
  for p, need in zip(params, (m * n, m * k, n * k)):
    if not isinstance(p.dtype, PtrDType) or p.dtype.size < need: return None
  return m, n, k, out_bf16
