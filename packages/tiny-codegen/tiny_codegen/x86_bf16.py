"""AVX512-BF16 bfloat16 matrix products on x86-64 CPUs that run `vdpbf16ps` and no AMX tiles (issue #39): a GEMM
kernel's LLVM IR built on `llvm.x86.avx512bf16.dpbf16ps.512` (16 float32 lanes, each += a[2i] * b[2i] + a[2i+1] *
b[2i+1]: two exact bfloat16 products).

Reached like `tiny_codegen.x86_amx`'s tile kernel: `Tensor.dot` builds the same one-kernel AST for a 2-D bfloat16
product (the float32 sum of the products, cast to bfloat16), `x86_amx.match_matmul_layout` recognises it, and
`tiny_codegen.program` compiles this module's kernel for it where the tiles don't run (`x86_amx.request_tile_state()`
False or the tile kernel's blocks don't divide the shape), the machine model lists `avx512_bf16` and the probe ran
`vdpbf16ps` (`usable`). Why this kernel there: on Zen 4 (no AMX) one thread's 16 independent `vdpbf16ps zmm` chains
do 2x the flops of `vfmadd231ps zmm` ones (bench/README.md: 235 vs 117.5 GFLOPS), so the widened float32 GEMM runs at
half of what the instruction allows; on a Xeon whose tiles run, AMX stays first.

The kernel, `void <name>(float *out, uint16 *a, uint16 *b, i32 core_id)`, one call per thread `core_id` of `threads`
(the CPU runtime's convention): thread t takes column-strip share t % ct (strips of NR = 16 x `nv` columns, the shares
as even as whole strips allow) and row share t // ct (whole MR-row blocks): `split_threads`.
- `a`: A (M, K) bfloat16 bits, rows `lda` elements apart; `b`: B (K, N) bfloat16 bits, row-major;
- `out`: (M, N) float32 (or bfloat16 bits, `out_bf16`: rounded as tiny's cast rounds), row-major.
Loops, outermost first:
1. the thread's column strips: the strip's B columns packed into a stack buffer as (ceil(K/2), NR, 2), the two values
   of one k-pair of a column side by side (the operand layout of VDPBF16PS), so one zmm load is 16 columns x one
   k-pair; columns past N (the last strip of an N that NR doesn't divide) and the missing second row of an odd K
   pack as zeros (masked loads);
2. the thread's rows in blocks of MR (`register_block`), the last block of M's MR-remainder rows by a second
   micro-kernel of that many rows;
3. the micro-kernel: MR x `nv` float32 accumulators in registers over all of K: per k-pair `nv` B loads and MR
   32-bit broadcasts of A's k-pair (`vbroadcastss` into a register each row's `nv` products share), MR x `nv`
   `vdpbf16ps`; an odd K's last k alone (A's value zero-extended: no read past a row); then one store (masked in the
   last strip of a ragged N).
Numbers: each lane adds exact bfloat16 products in float32 (round to nearest even), as `Tensor.dot`'s float32 kernel
does, in another order; like the AMX tiles, VDPBF16PS treats denormal inputs as zero and flushes denormal results
(Intel SDM vol. 2, VDPBF16PS: MXCSR not consulted), so sums below float32's normal range (~1.2e-38) read 0.
"""
from __future__ import annotations

import functools
from typing import Any

from tiny_codegen import cpu_probe
from tiny_codegen.x86_amx import round_bf16_ir, thread_stack_limit
from tiny_codegen.machine import Machine, fma_chains, machine_of

__all__ = ["LANES", "MAX_K", "register_block", "plan", "split_threads", "stack_bytes", "fits", "usable", "for_renderer",
           "avx512_bf16_matmul_ir"]

LANES = 16
"""float32 lanes of one zmm accumulator: the columns one B load (16 columns x one k-pair of bfloat16) feeds."""
MAX_K = 1 << 14
"""The largest K the kernel takes: its packed strip (K x NR bfloat16) lives on the thread's stack (`fits`)."""


def register_block(m: Machine, k: int, n: int = 0, threads: int = 1, rows: int = 0) -> tuple[int, int]:
  """(MR, nv): the micro-kernel's rows and zmm columns (NR = 16 x nv) on machine `m`, for K = `k` (and N = `n` over
  `threads`, and M = `rows`, when given). Its registers: MR x nv accumulators, nv B vectors, one spare (a broadcast the
  instruction can't fold) within `m`'s `vector_registers`; at least `fma_chains(m)` accumulators (the dot product's
  latency x issue rate, taken as the FMA's); the strip's packed B (K x NR bfloat16) at most half the L2, where it stays
  while every row block of A passes over it. Of those, the most flops per load (MR x nv products for MR broadcasts and
  nv B loads: MR x nv / (MR + nv)) times the share of useful columns in what the busiest thread computes (its whole
  strips, times the threads: a ragged last strip and uneven strip shares waste) and of useful rows in whole MR-row
  blocks (the MR-remainder block's few accumulators run at a fraction of the rate: a 32-row prefill chunk over 5-row
  blocks left 2 rows to a 10-accumulator pass; 4-row blocks of 6 vectors divide it: Zen 4, one thread, 32 x 768 x 768
  thread CPU 204 -> 193 us, 32 x 768 x 2048 535 -> 505), then the most accumulators.

  >>> register_block(Machine.default(), 1024), register_block(Machine.default(), 4096)
  ((5, 5), (6, 4))
  >>> register_block(Machine.default(), 1024, 1024, 2)  # 16 strips of 64 split evenly; 13 of 80 don't
  (6, 4)
  >>> register_block(Machine.default(), 768, 768, 1, 32)  # 32 rows: 8 blocks of 4, not 6 of 5 and one of 2
  (4, 6)
  """
  regs, chains = m.vector_registers, fma_chains(m)
  best: tuple[float, int, int, int] | None = None
  for nv in range(1, regs):
    mr = (regs - 1 - nv) // nv
    if mr < 1 or mr * nv < chains: continue
    if nv > 1 and k * LANES * nv * 2 > m.l2 // 2: continue  # one column vector is the floor: it always fits (`fits`)
    use = 1.0
    if n > 0:
      strips = -(-n // (LANES * nv))
      ct = max(1, min(threads, strips))
      use = n / (-(-strips // ct) * LANES * nv * ct)
    if rows > 0: use *= rows / (-(-rows // mr) * mr)
    cand = (mr * nv / (mr + nv) * use, mr * nv, mr, nv)
    if best is None or cand > best: best = cand
  if best is None: raise ValueError(f"register_block: {regs} vector registers hold no {chains}-accumulator block")
  return best[2], best[3]


@functools.lru_cache(maxsize=256)
def plan(m: Machine, rows: int, n: int, k: int, threads: int, stack_limit: int) -> tuple[int, int] | None:
  """(MR, nv) of the kernel for an (rows, k) @ (k, n) product on machine `m` over `threads` (`register_block`), or
  None where it doesn't take the shape (`fits`) or `m` has no register file for it. Doesn't probe: ask `usable`.
  Kept per argument tuple (a pure function of them; `m` is a frozen Machine): `Tensor.dot` asks it on every bfloat16
  product, and `register_block`'s search over the register file cost ~15 us of its ~100 us graph building."""
  if m.vector_bytes != 64 or m.vector_registers - 2 < fma_chains(m) or not fits(rows, n, k, LANES, stack_limit):
    return None  # (nv = 1 with MR = registers - 2 is the block every register file that holds one has)
  mr, nv = register_block(m, k, n, threads, rows)
  return (mr, nv) if fits(rows, n, k, LANES * nv, stack_limit) else None


def split_threads(m: int, n: int, threads: int, mr: int, nr: int) -> tuple[int, int]:
  """(row threads, column threads) for an (m, n) output over up to `threads`: column strips of `nr` first (each
  thread packs only its own strips' B), as many as there are strips; the threads left over split the MR-row blocks.

  >>> split_threads(1024, 1024, 2, 6, 64), split_threads(4096, 64, 2, 6, 64), split_threads(5, 32, 4, 6, 64)
  ((1, 2), (2, 1), (1, 1))
  """
  strips, blocks = -(-n // nr), -(-m // mr)
  ct = max(1, min(threads, strips))
  return max(1, min(threads // ct, blocks)), ct


def stack_bytes(k: int, nr: int) -> int:
  """The kernel's stack frame for K = `k`, NR = `nr`: the packed strip, ceil(K/2) k-pairs x NR x 2 bfloat16."""
  return -(-k // 2) * nr * 4


def fits(m: int, n: int, k: int, nr: int, stack_limit: int) -> bool:
  """Whether the kernel takes an (m, k) @ (k, n) product with strips of `nr` columns: positive int sizes, K at most
  `MAX_K`, i64 offsets (any size a buffer holds) and its stack frame (`stack_bytes`) at most a quarter of a thread's
  stack (`stack_limit`: `x86_amx.thread_stack_limit()`). No divisibility: ragged edges are handled in the kernel."""
  return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (m, n, k)) and k <= MAX_K and \
    4 * stack_bytes(k, nr) <= stack_limit


def usable(m: Machine) -> bool:
  """Whether machine `m` takes this kernel: 64-byte vectors, `avx512_bf16` in its `isa`, the probe's child ran
  `vdpbf16ps` (`cpu_probe.executes`: never an instruction it didn't confirm), and no AMX tiles run there. Where they
  run (a Sapphire Rapids Xeon) the shapes the tile kernel doesn't take keep the float32 GEMM: there an AVX512-BF16
  kernel was measured at ~0.45x the float32 kernel's flops (`x86_amx`'s module docstring), where on Zen 4 (no AMX)
  `vdpbf16ps` does 2x the FMA's."""
  if m.vector_bytes != 64 or "avx512_bf16" not in m.isa: return False
  if {"amx_tile", "amx_bf16"} <= m.isa and cpu_probe.executes("amx_bf16", m.isa): return False
  return cpu_probe.executes("avx512_bf16", m.isa)


def for_renderer(renderer: Any, m: int, n: int, k: int) -> tuple[int, int] | None:
  """(MR, nv) where this kernel takes an (m, k) @ (k, n) bfloat16 product compiled by `renderer`: the LLVM renderer
  (the CPU's), `plan` for the shape over its threads and this module's stack limit, and `usable` on its machine
  model; None otherwise. The one question `Tensor.dot`, the LLM's prefill weights and `tiny_codegen.program` ask."""
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  if not isinstance(renderer, LLVMRenderer): return None
  mach = machine_of(renderer)
  threads = max(1, int(getattr(renderer, "threads", 1)))
  if (blk := plan(mach, m, n, k, threads, thread_stack_limit())) is None: return None
  return blk if usable(mach) else None  # the probe last: it may start a child


def _check(m: int, n: int, k: int, threads: int, lda: int, mr: int, nv: int) -> None:
  for name, v in (("M", m), ("N", n), ("K", k), ("threads", threads), ("lda", lda), ("mr", mr), ("nv", nv)):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"avx512_bf16_matmul_ir: {name} must be a positive int, got {v!r}")
  if lda < k: raise ValueError(f"avx512_bf16_matmul_ir: lda={lda} is less than K={k}; valid: lda >= K")
  if k > MAX_K: raise ValueError(f"avx512_bf16_matmul_ir: K={k} is more than {MAX_K} (the packed strip lives on the "
                                 f"stack); valid: K <= {MAX_K}")


def _vec(vals: list[str], ty: str) -> str: return "<" + ", ".join(f"{ty} {v}" for v in vals) + ">"


def _mask(nvalid: int, v: int) -> str:
  """Constant <16 x i1> mask of the lanes of column vector `v` below `nvalid` columns."""
  return _vec(["true" if LANES * v + c < nvalid else "false" for c in range(LANES)], "i1")


def _micro(name: str, mr: int, nv: int, n: int, k: int, lda: int, out_bf16: bool, nvalid: int) -> list[str]:
  """The micro-kernel `@<name>.mk<mr>(out, a, pk, row0, col0, edge)`: rows row0 .. row0+mr of A times the packed
  strip at `pk`, stored at columns col0 ..; `edge`: the last strip, its first `nvalid` columns stored (masked)."""
  nr, kp = LANES * nv, k // 2
  acc = [(r, v) for r in range(mr) for v in range(nv)]
  ln = [f"define internal void @{name}.mk{mr}(ptr noalias %out, ptr noalias %a, ptr noalias %pk, i64 %row0, "
        "i64 %col0, i1 %edge) #0 {", "entry:"]
  for r in range(mr):
    ln += [f"  %ar{r} = add i64 %row0, {r}", f"  %ao{r} = mul i64 %ar{r}, {lda}",
           f"  %ap{r} = getelementptr inbounds i16, ptr %a, i64 %ao{r}"]
  ln += ["  br label %k.head", "k.head:", "  %p = phi i64 [0, %entry], [%p.next, %k.body]"]
  ln += [f"  %c{r}_{v} = phi <16 x float> [zeroinitializer, %entry], [%n{r}_{v}, %k.body]" for r, v in acc]
  ln += [f"  %k.ok = icmp slt i64 %p, {kp}", "  br i1 %k.ok, label %k.body, label %k.exit", "k.body:"]

  def step(p: str, src: dict[tuple[int, int], str], dst: str, half: bool) -> list[str]:
    out = [f"  %{dst}bo = mul i64 {p}, {2 * nr}"]
    for v in range(nv):
      out += [f"  %{dst}bi{v} = add i64 %{dst}bo, {2 * LANES * v}",
              f"  %{dst}bq{v} = getelementptr inbounds i16, ptr %pk, i64 %{dst}bi{v}",
              f"  %{dst}b{v} = load <32 x bfloat>, ptr %{dst}bq{v}, align 64"]
    out.append(f"  %{dst}ak = shl i64 {p}, 1")
    for r in range(mr):
      out.append(f"  %{dst}aq{r} = getelementptr inbounds i16, ptr %ap{r}, i64 %{dst}ak")
      if half: out += [f"  %{dst}ah{r} = load i16, ptr %{dst}aq{r}, align 2",  # an odd K's last k alone
                       f"  %{dst}ai{r} = zext i16 %{dst}ah{r} to i32"]
      else: out.append(f"  %{dst}ai{r} = load i32, ptr %{dst}aq{r}, align 2")
      out += [f"  %{dst}as{r} = insertelement <16 x i32> poison, i32 %{dst}ai{r}, i64 0",
              f"  %{dst}aw{r} = shufflevector <16 x i32> %{dst}as{r}, <16 x i32> poison, <16 x i32> zeroinitializer",
              f"  %{dst}ab{r} = bitcast <16 x i32> %{dst}aw{r} to <32 x bfloat>"]
      for v in range(nv):
        out.append(f"  %{dst}{r}_{v} = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> "
                   f"{src[(r, v)]}, <32 x bfloat> %{dst}ab{r}, <32 x bfloat> %{dst}b{v})")
    return out
  ln += step("%p", {(r, v): f"%c{r}_{v}" for r, v in acc}, "n", False)
  ln += ["  %p.next = add i64 %p, 1", "  br label %k.head", "k.exit:"]
  fin = {(r, v): f"%c{r}_{v}" for r, v in acc}
  if k % 2:
    ln += step(str(kp), fin, "t", True)
    fin = {(r, v): f"%t{r}_{v}" for r, v in acc}
  ragged = nvalid < nr
  ln += ["  br i1 %edge, label %st.edge, label %st.full" if ragged else "  br label %st.full"]
  for blk in (["full", "edge"] if ragged else ["full"]):
    ln.append(f"st.{blk}:")
    for r, v in acc:
      x, val = f"%{blk[0]}{r}_{v}", fin[(r, v)]
      ln += [f"  {x}o = mul i64 %ar{r}, {n}", f"  {x}c = add i64 %col0, {LANES * v}", f"  {x}i = add i64 {x}o, {x}c"]
      ty, ety = ("<16 x i16>", "i16") if out_bf16 else ("<16 x float>", "float")
      if out_bf16:  # tiny's float -> bfloat16 cast: ties to even, NaN -> 0x7FC0
        ln += round_bf16_ir(x, val)
        val = f"{x}v"
      ln.append(f"  {x}p = getelementptr inbounds {ety}, ptr %out, i64 {x}i")
      if blk == "full": ln.append(f"  store {ty} {val}, ptr {x}p, align {2 if out_bf16 else 4}")
      else: ln.append(f"  call void @llvm.masked.store.{'v16i16' if out_bf16 else 'v16f32'}.p0({ty} {val}, "
                      f"ptr {x}p, i32 {2 if out_bf16 else 4}, <16 x i1> {_mask(nvalid, v)})")
    ln.append("  ret void")
  return ln + ["}"]


def avx512_bf16_matmul_ir(m: int, n: int, k: int, threads: int = 1, name: str = "avx512_bf16_matmul",
                          out_bf16: bool = False, lda: int | None = None, mr: int = 6, nv: int = 4) -> str:
  """The LLVM IR module of the GEMM described in the module docstring, for A (m, k) @ B (k, n) over up to `threads`
  (`split_threads`; launch it with `threads` calls: a thread past the split's count finds no work), micro-kernel
  `mr` rows x `nv` zmm columns (`register_block`). `out_bf16`: `out` is bfloat16 bits, each float32 sum rounded as
  tiny's cast rounds (to nearest even, NaN -> 0x7FC0). `lda`: A's row stride in elements (K when None). ValueError
  for a size that isn't a positive int, `lda` < K or K over `MAX_K`. Only run what it compiles to where `usable`.

  >>> "dpbf16ps" in avx512_bf16_matmul_ir(7, 40, 33, threads=2)
  True
  """
  lda = k if lda is None else lda
  _check(m, n, k, threads, lda, mr, nv)
  nr, kp = LANES * nv, -(-k // 2)
  strips, blocks = -(-n // nr), -(-m // mr)
  rt, ct = split_threads(m, n, threads, mr, nr)
  nvalid, rem = n - (strips - 1) * nr, m % mr
  ragged = nvalid < nr
  ln = ["declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)",
        "declare <16 x i16> @llvm.masked.load.v16i16.p0(ptr, i32, <16 x i1>, <16 x i16>)",
        "declare void @llvm.masked.store.v16f32.p0(<16 x float>, ptr, i32, <16 x i1>)",
        "declare void @llvm.masked.store.v16i16.p0(<16 x i16>, ptr, i32, <16 x i1>)"]
  ln += _micro(name, mr, nv, n, k, lda, out_bf16, nvalid)
  if rem: ln += _micro(name, rem, nv, n, k, lda, out_bf16, nvalid)
  ln += [f"define void @{name}(ptr noalias %out, ptr noalias %a, ptr noalias %b, i32 %core_id) #0 {{", "entry:",
         f"  %pk = alloca [{kp * nr * 2} x i16], align 64", "  %cid = zext i32 %core_id to i64",
         f"  %ci = urem i64 %cid, {ct}", f"  %ri = udiv i64 %cid, {ct}", "  %ci1 = add i64 %ci, 1",
         "  %ri1 = add i64 %ri, 1", f"  %s0m = mul i64 %ci, {strips}", f"  %s0 = udiv i64 %s0m, {ct}",
         f"  %s1m = mul i64 %ci1, {strips}", f"  %s1 = udiv i64 %s1m, {ct}",
         f"  %b0m = mul i64 %ri, {blocks}", f"  %b0 = udiv i64 %b0m, {rt}", f"  %b1m = mul i64 %ri1, {blocks}",
         f"  %b1 = udiv i64 %b1m, {rt}", f"  %r0 = mul i64 %b0, {mr}", f"  %r1m = mul i64 %b1, {mr}",
         f"  %r1c = icmp ult i64 %r1m, {m}", f"  %r1 = select i1 %r1c, i64 %r1m, i64 {m}",
         f"  %live = icmp ult i64 %ri, {rt}",  # threads past rt x ct: no work
         "  %s1l = select i1 %live, i64 %s1, i64 %s0", "  br label %s.head",
         "s.head:", "  %s = phi i64 [%s0, %entry], [%s.next, %r.exit]", "  %s.ok = icmp ult i64 %s, %s1l",
         "  br i1 %s.ok, label %pack, label %done", "pack:", f"  %col0 = mul i64 %s, {nr}",
         f"  %edge = icmp eq i64 %s, {strips - 1}" if ragged else "  %edge = icmp eq i64 0, 1"]
  for v in range(nv):
    ln.append(f"  %mk{v} = select i1 %edge, <16 x i1> {_mask(nvalid, v)}, <16 x i1> {_mask(nr, v)}")
  inter = _vec([str(c + d) for c in range(LANES) for d in (0, LANES)], "i32")

  def pack_pair(p: str, tag: str, second: bool) -> list[str]:
    """k-pair `p`'s rows 2p and 2p+1 (zeros when not `second`) of the strip, interleaved into the buffer."""
    out = [f"  %{tag}r0 = mul i64 {p}, {2 * n}", f"  %{tag}o0 = add i64 %{tag}r0, %col0",
           f"  %{tag}o1 = add i64 %{tag}o0, {n}", f"  %{tag}w = mul i64 {p}, {2 * nr}"]
    for v in range(nv):
      for j in (0, 1) if second else (0,):
        out += [f"  %{tag}i{j}_{v} = add i64 %{tag}o{j}, {LANES * v}",
                f"  %{tag}q{j}_{v} = getelementptr i16, ptr %b, i64 %{tag}i{j}_{v}",
                f"  %{tag}x{j}_{v} = call <16 x i16> @llvm.masked.load.v16i16.p0(ptr %{tag}q{j}_{v}, i32 2, "
                f"<16 x i1> %mk{v}, <16 x i16> zeroinitializer)"]
      hi = f"%{tag}x1_{v}" if second else "zeroinitializer"
      out += [f"  %{tag}y{v} = shufflevector <16 x i16> %{tag}x0_{v}, <16 x i16> {hi}, <32 x i32> {inter}",
              f"  %{tag}d{v} = add i64 %{tag}w, {2 * LANES * v}",
              f"  %{tag}z{v} = getelementptr inbounds i16, ptr %pk, i64 %{tag}d{v}",
              f"  store <32 x i16> %{tag}y{v}, ptr %{tag}z{v}, align 64"]
    return out
  ln += ["  br label %p.head", "p.head:", "  %p = phi i64 [0, %pack], [%p.next, %p.body]",
         f"  %p.ok = icmp ult i64 %p, {k // 2}", "  br i1 %p.ok, label %p.body, label %p.exit", "p.body:",
         *pack_pair("%p", "P", True), "  %p.next = add i64 %p, 1", "  br label %p.head", "p.exit:"]
  if k % 2: ln += pack_pair(str(k // 2), "T", False)
  ln += ["  br label %r.head", "r.head:", "  %row = phi i64 [%r0, %p.exit], [%row.next, %r.body]",
         f"  %rend = add i64 %row, {mr}", "  %r.ok = icmp ule i64 %rend, %r1",
         "  br i1 %r.ok, label %r.body, label %r.tail", "r.body:",
         f"  call void @{name}.mk{mr}(ptr %out, ptr %a, ptr %pk, i64 %row, i64 %col0, i1 %edge)",
         f"  %row.next = add i64 %row, {mr}", "  br label %r.head", "r.tail:"]
  if rem:
    ln += ["  %left = icmp ult i64 %row, %r1", "  br i1 %left, label %r.rem, label %r.exit", "r.rem:",
           f"  call void @{name}.mk{rem}(ptr %out, ptr %a, ptr %pk, i64 %row, i64 %col0, i1 %edge)"]
  ln += ["  br label %r.exit", "r.exit:", "  %s.next = add i64 %s, 1", "  br label %s.head", "done:", "  ret void", "}",
         'attributes #0 = { nounwind "target-features"="+avx512f,+avx512bw,+avx512vl,+avx512bf16" }']
  return "\n".join(ln) + "\n"
