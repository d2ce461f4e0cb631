"""AMX bfloat16 matrix products on x86-64 CPUs that run them (issue #39): a GEMM kernel's LLVM IR built on the tile
instructions, and this process's permission to use the tile state.

Reached from `Tensor.dot` (bfloat16 2-D operands on the CPU where `request_tile_state()` holds and 32 divides M, N
and K): `dot` sums `A.float() * B.float()` over k, cast to bfloat16, in one kernel, and `tiny_codegen.program` hands
a kernel AST that `match_matmul` recognises to this kernel instead of lowering it: one launch, B's pack included.
`bench/bench_bf16.py` measures it beside torch's. AMX or `vdpbf16ps` is a per-machine answer: on the Sapphire
Rapids VM (tiles run) a `vdpbf16ps zmm` (64 flops) issues at ~0.2x the rate of a `vfmadd231ps zmm` (32 flops), so an
AVX512-BF16 kernel does ~0.45x the float32 FMA kernel's flops (bench/README.md, "bfloat16: AMX") and only the tiles
reach oneDNN's figures: where they run, this kernel is chosen. On Zen 4 (no AMX) a `vdpbf16ps zmm` issues at the
FMA's rate, 2x its flops: there, wherever the tiles don't run, the product goes to `tiny_codegen.x86_bf16`'s kernel
when the probe confirms AVX512-BF16 (where they run, the shapes their blocks don't divide keep the float32 GEMM).

The kernel, `void <name>(float *out, uint16 *a, uint16 *b, i32 core_id)`, one call per thread `core_id` of
`threads` (the CPU runtime's convention), computes one row share of out = A @ B (rows [i * M/rt, (i+1) * M/rt) for
i = core_id % rt, rt = threads / col_threads) times one share of its column blocks (those of share
core_id // rt of `col_threads`: `split_threads`, for a 32-row prefill chunk whose one row block can't split),
summed in float32 (each `tdpbf16ps` adds pairs of exact bfloat16 products):
- `a`: A (M, K) bfloat16 bits, row-major; `b`: B (K, N) bfloat16 bits, row-major (or in the kernel's panels,
  `b_packed`);
- `out`: (M, N) float32 (or bfloat16 bits, `out_bf16`), row-major.
Tiles (AMX palette 1: 8 tiles of at most 16 rows x 64 bytes): 2 A tiles (16 rows x 32 k) and 2 B tiles (16 k-pairs x
16 columns) feed 4 float32 C tiles, a 32 x 32 output block. Loops, outermost first:
1. column blocks (32 columns): the block's B columns are packed into a stack buffer as (2, K/2, 16, 2), the pairs of
   consecutive k of one column side by side (the B operand layout of TDPBF16PS, Intel SDM vol. 2), so a B tile is
   1 KB contiguous; each thread packs the blocks itself, in the launch that uses them (no pack kernel);
2. groups of up to `GROUP_MAX` row blocks of the thread's share; 3. K blocks (`k_block`, from the L1d: the group's
   row blocks take turns on one K block of the panel; the C tiles wait in a stack buffer between K blocks; one block
   up to K=1536 on a 48 KB L1d); 4. the group's row blocks; 5. k in steps of 32 (4 `tdpbf16ps`, 2 A and 2 B tile
   loads, a prefetch of the next step's A rows).
LLVM's tile configuration pass writes the `ldtilecfg` (the shapes are constants here).
"""
from __future__ import annotations

import ctypes
import functools
import math
import platform
import resource
import threading

from tiny_uop.dtype import PtrDType, dtypes
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen import cpu_probe

__all__ = ["TILE_ROWS", "TILE_BYTES", "BLOCK", "MAX_K", "amx_bf16_matmul_ir", "split_threads", "k_block", "row_group",
           "a_row_pad", "pack_b", "round_bf16_ir", "register_packed_b", "registered_packed_b",
           "match_matmul_layout", "A_PAD_MIN_COLUMNS", "A_PAD_COPY_SHARE", "A_PAD_COPY_PASSES",
           "request_tile_state", "fits", "match_matmul", "stack_bytes", "thread_stack_limit"]

TILE_ROWS, TILE_BYTES = 16, 64
"""AMX palette 1: a tile holds at most 16 rows of 64 bytes (Intel SDM vol. 1, "Intel AMX")."""
K_STEP = TILE_BYTES // 2
"""bfloat16 values of k one A tile row holds (32)."""
BLOCK = 2 * TILE_ROWS
"""The output block one thread keeps in its 4 C tiles: BLOCK x BLOCK (32 x 32)."""
PANEL_BYTES_PER_K = BLOCK * 2
"""Bytes a k of one packed B panel pair takes (32 columns of bfloat16): the kernel's stack buffer is K times this."""
MAX_K = 1 << 14
"""The largest K the kernel takes: its packed panel pair (K x 64 bytes, 1 MB here) lives on the thread's stack."""
A_PREFETCH_STEPS = 1
"""K steps (of 32) ahead the kernel prefetches its 32 A rows into L1 (`prefetcht0`, one a row). The A tiles come from
L2 (the thread's share of A) or further; one thread, the kernel alone, in turns (load 6-8), GFLOPS without / with a
1-step prefetch: 1024² 580/626, 301/572, 501/558, 351/561, 578/612; 4096² 101/129, 171/191; 512² 719/816; 2 and 4
steps ahead were between the two."""
GROUP_MAX = 8
"""Row blocks at most that share one K block of the packed panel pair (their C tiles wait in 8 x 4 KB)."""

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # asm/unistd_64.h, asm/prctl.h


def _check_shape(m: int, n: int, k: int, threads: int, col_threads: int = 1) -> None:
  for name, v in (("M", m), ("N", n), ("K", k), ("threads", threads), ("col_threads", col_threads)):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"amx_bf16_matmul_ir: {name} must be a positive int, got {v!r}")
  if threads % col_threads:
    raise ValueError(f"amx_bf16_matmul_ir: threads={threads} must be a multiple of col_threads={col_threads}")
  rt = threads // col_threads
  if m % (BLOCK * rt): raise ValueError(f"amx_bf16_matmul_ir: M={m} must be a multiple of {BLOCK} x threads "
                                        f"({BLOCK * rt} for threads={threads}: {rt} over rows, {col_threads} over "
                                        "columns)")
  if n % BLOCK: raise ValueError(f"amx_bf16_matmul_ir: N={n} must be a multiple of {BLOCK}")
  if (n // BLOCK) % col_threads:
    raise ValueError(f"amx_bf16_matmul_ir: N={n}'s {n // BLOCK} column blocks must split evenly over "
                     f"col_threads={col_threads}")
  if k % K_STEP: raise ValueError(f"amx_bf16_matmul_ir: K={k} must be a multiple of {K_STEP}")
  if k > MAX_K: raise ValueError(f"amx_bf16_matmul_ir: K={k} is more than {MAX_K} (the packed B panel pair lives on "
                                 f"the stack, {PANEL_BYTES_PER_K} bytes a k); valid: K <= {MAX_K}")
  if m * k >= 2 ** 31 or m * n >= 2 ** 31 or n * k >= 2 ** 31:  # the element offsets are i32
    raise ValueError(f"amx_bf16_matmul_ir: {m}x{k} @ {k}x{n} has an operand of 2**31 or more elements; valid: fewer")


def k_block(k: int, l1d: int) -> int:
  """The K block of the tile kernel: the largest multiple of 32 that divides `k` and whose packed B panel pair
  (32 columns x kb values of bfloat16, 64 bytes a k) takes at most twice an `l1d`-byte L1d (at least 32). Measured
  on the 48 KB-L1d Sapphire Rapids VM (bench/README.md, "bfloat16 1024²: one launch"): one thread's 1024² ran 476,
  542, 608 and 632 GFLOPS at kb 128, 256, 512 and 1024 (B's panel in L1 buys less than the C tiles' round trips to
  the stack between K blocks cost), 4096² 136, 203, 219, 218: blocks below ~L1d lose, those up to 2x L1d don't.

  >>> k_block(1024, 48 << 10), k_block(4096, 32 << 10), k_block(96, 48 << 10)
  (1024, 1024, 96)
  """
  if not isinstance(k, int) or k <= 0 or k % K_STEP:
    raise ValueError(f"k_block: K={k!r}; valid: a positive multiple of {K_STEP}")
  if not isinstance(l1d, int) or l1d <= 0: raise ValueError(f"k_block: l1d={l1d!r}; valid: a positive byte count")
  best = K_STEP
  for kb in range(K_STEP, k + 1, K_STEP):
    if k % kb == 0 and kb * PANEL_BYTES_PER_K <= 2 * l1d: best = kb
  return best


def row_group(rows: int) -> int:
  """Row blocks (32 rows each) of one thread's share that take turns on an L1-resident K block of B: the most, up to
  `GROUP_MAX`, that divide the share's blocks (their float32 C tiles wait in a GROUP x 4 KB stack buffer between K
  blocks)."""
  blocks = rows // BLOCK
  return max(g for g in range(1, GROUP_MAX + 1) if blocks % g == 0)


def split_threads(m: int, n: int, threads: int) -> tuple[int, int]:
  """(threads, col_threads) the tile kernel runs an (m, k) @ (k, n) product on, with up to `threads`: row shares
  first, as many as 32-row blocks divide evenly (each thread packs every column block of B for its rows); where that
  leaves threads idle (a 32-row prefill chunk has one row block), their column blocks split among the rest: each
  thread packs and multiplies its own columns, A's rows read by all. Elsewhere fewer threads.

  >>> split_threads(1024, 1024, 2), split_threads(32, 2048, 2), split_threads(32, 96, 2), split_threads(64, 64, 4)
  ((2, 1), (2, 2), (1, 1), (4, 2))
  """
  rt = max(t for t in range(1, max(1, threads) + 1) if m % (BLOCK * t) == 0)
  ct = max(c for c in range(1, max(1, threads // rt) + 1) if (n // BLOCK) % c == 0)
  return rt * ct, ct


def amx_bf16_matmul_ir(m: int, n: int, k: int, threads: int = 1, name: str = "amx_bf16_matmul",
                       out_bf16: bool = False, kb: int | None = None, lda: int | None = None,
                       col_threads: int = 1, b_packed: bool = False) -> str:
  """The LLVM IR module of the tile GEMM described in the module docstring, for A (m, k) @ B (k, n) split into
  `threads` shares: `threads / col_threads` of the rows times `col_threads` of the column blocks (thread `core_id`
  takes row share core_id % row threads and column share core_id // row threads; `split_threads`); `kb` is its K block
  (`k_block(k, 48 KB)` when None). `out_bf16`: `out` is bfloat16 (uint16
  bits), each float32 sum rounded as tiny's cast rounds (to nearest even, NaN -> 0x7FC0, denormals kept), through a
  1 KB stack buffer per C tile. `lda`: A's row stride in elements (K when None; more for A's rows padded apart,
  `a_row_pad`). `b_packed`: `b` already holds B in the kernel's panels, (N/32, 2, K/2, 16, 2) (`pack_b`: laid out once
  for a weight multiplied again and again), so the kernel reads each column block's 1 KB tiles from it in place
  instead of packing 32 columns of B's rows, 4 KB apart for N = 2048, into its stack. ValueError for a shape
  the blocks don't divide (M a multiple of 32 x threads, N of 32, K of 32 and at
  most `MAX_K`, `kb` a multiple of 32 dividing K, `lda` at least K). Only run what it compiles to where
  `request_tile_state()` returned True.

  >>> "tdpbf16ps" in amx_bf16_matmul_ir(64, 32, 32, threads=2)
  True
  """
  _check_shape(m, n, k, threads, col_threads)
  kb = k_block(k, 48 << 10) if kb is None else kb
  if not isinstance(kb, int) or kb <= 0 or kb % K_STEP or k % kb:
    raise ValueError(f"amx_bf16_matmul_ir: kb={kb!r}; valid: a multiple of {K_STEP} that divides K={k}")
  lda = k if lda is None else lda
  if not isinstance(lda, int) or isinstance(lda, bool) or lda < k or m * lda >= 2 ** 31:
    raise ValueError(f"amx_bf16_matmul_ir: lda={lda!r}; valid: an int of at least K={k} with M x lda < 2**31")
  rt, ncb = threads // col_threads, n // BLOCK // col_threads
  rows, nkb = m // rt, k // kb
  group = row_group(rows)
  tt = f"i16 {TILE_ROWS}, i16 {TILE_BYTES}"  # every tile's shape: 16 rows x 64 bytes
  ln = [
    "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
    "declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
    "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)",
    "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
    f"define void @{name}(ptr noalias %out, ptr noalias %a, ptr noalias %b, i32 %core_id) #0 {{",
    "entry:", "  %cbuf = alloca [256 x float], align 64",
    *([] if b_packed else [f"  %pk = alloca [{k * BLOCK} x i16], align 64"]),
    f"  %acc = alloca [{group * BLOCK * BLOCK} x float], align 64", f"  %rt = urem i32 %core_id, {rt}",
    f"  %ct = udiv i32 %core_id, {rt}", f"  %r0 = mul i32 %rt, {rows}", f"  %cb0 = mul i32 %ct, {ncb}",
    f"  %cb1 = add i32 %cb0, {ncb}", "  br label %cb.head",
    # column blocks outside: the block's B columns packed once into %pk, then reused by every row block
    "cb.head:", "  %cb = phi i32 [%cb0, %entry], [%cb.next, %g.exit]", "  %cb.ok = icmp slt i32 %cb, %cb1",
    "  br i1 %cb.ok, label %pack.pre, label %done", "pack.pre:", f"  %bc0 = mul i32 %cb, {BLOCK}"]
  if b_packed:  # the block's panel pair in place: K x 32 values from cb * K * 32
    ln += [f"  %pko = mul i32 %cb, {k * BLOCK}", "  %pkb = getelementptr inbounds i16, ptr %b, i32 %pko",
           "  br label %pack.exit", "pack.exit:", "  br label %g.head"]
  else: ln += ["  br label %pack.head", *_pack_panel(n, k)]
  ln += [  # groups of row blocks; in each, K blocks; in each, the group's row blocks on that K block of %pk (in L1)
    "g.head:", "  %g = phi i32 [0, %pack.exit], [%g.next, %kc.exit]",
    f"  %g.ok = icmp slt i32 %g, {rows // BLOCK // group}", "  br i1 %g.ok, label %kc.head, label %g.exit",
    "kc.head:", "  %kc = phi i32 [0, %g.head], [%kc.next, %rb.exit]", f"  %kc.ok = icmp slt i32 %kc, {nkb}",
    "  br i1 %kc.ok, label %rb.head, label %kc.exit",
    "rb.head:", "  %rb = phi i32 [0, %kc.head], [%rb.next, %st.done]", f"  %rb.ok = icmp slt i32 %rb, {group}",
    "  br i1 %rb.ok, label %init, label %rb.exit",
    "init:", f"  %gr = mul i32 %g, {group}", "  %grb = add i32 %gr, %rb", f"  %rbr = mul i32 %grb, {BLOCK}",
    "  %row0 = add i32 %r0, %rbr", f"  %accb = mul i32 %rb, {BLOCK * BLOCK}", "  %first = icmp eq i32 %kc, 0",
    f"  %last = icmp eq i32 %kc, {nkb - 1}", "  br i1 %first, label %c.zero, label %c.load", "c.zero:"]
  ln += [f"  %z{t} = call x86_amx @llvm.x86.tilezero.internal({tt})" for t in range(4)]
  ln += ["  br label %k.pre", "c.load:"]
  for t in range(4):  # the group's C tiles between K blocks: 16 x 16 floats each, rows of 64 bytes
    ln += [f"  %lo{t} = add i32 %accb, {t * 256}", f"  %lp{t} = getelementptr inbounds float, ptr %acc, i32 %lo{t}",
           f"  %l{t} = call x86_amx @llvm.x86.tileloadd64.internal({tt}, ptr %lp{t}, i64 {TILE_BYTES})"]
  ln += ["  br label %k.pre", "k.pre:"]
  ln += [f"  %i{t} = phi x86_amx [%z{t}, %c.zero], [%l{t}, %c.load]" for t in range(4)]
  ln += [f"  %kb0 = mul i32 %kc, {kb // K_STEP}", f"  %kend = add i32 %kb0, {kb // K_STEP}", "  br label %k.head",
         "k.head:", "  %kb = phi i32 [%kb0, %k.pre], [%kb.next, %k.body]"]
  ln += [f"  %c{t} = phi x86_amx [%i{t}, %k.pre], [%d{t}, %k.body]" for t in range(4)]
  ln += ["  %k.ok = icmp slt i32 %kb, %kend", "  br i1 %k.ok, label %k.body, label %k.exit", "k.body:",
         f"  %ak = mul i32 %kb, {K_STEP}"]
  for i in range(2):  # A tile i: rows row0 + 16i .., k kb*32 .. +32, row stride lda*2 bytes
    ln += [f"  %ar{i} = add i32 %row0, {TILE_ROWS * i}", f"  %arow{i} = mul i32 %ar{i}, {lda}",
           f"  %ao{i} = add i32 %arow{i}, %ak", f"  %ap{i} = getelementptr inbounds i16, ptr %a, i32 %ao{i}",
           f"  %A{i} = call x86_amx @llvm.x86.tileloadd64.internal({tt}, ptr %ap{i}, i64 {lda * 2})"]
  for r in range(BLOCK):  # the next k step's A rows into L1 while these tiles multiply (A_PREFETCH_STEPS)
    ln += [f"  %pfr{r} = add i32 %row0, {r}", f"  %pfm{r} = mul i32 %pfr{r}, {lda}",
           f"  %pfa{r} = add i32 %pfm{r}, %ak",
           f"  %pfo{r} = add i32 %pfa{r}, {A_PREFETCH_STEPS * K_STEP}",
           f"  %pfp{r} = getelementptr i16, ptr %a, i32 %pfo{r}",  # not inbounds: past A's end, a prefetch is a no-op
           f"  call void @llvm.prefetch.p0(ptr %pfp{r}, i32 0, i32 3, i32 1)"]
  for j in range(2):  # B tile j: %pk's panel j (K*16 values), k-pairs kb*16 .. +16 (512 values), rows of 64 bytes
    ln += [f"  %bk{j} = mul i32 %kb, {K_STEP * 16}", f"  %bo{j} = add i32 %bk{j}, {j * k * 16}",
           f"  %bptr{j} = getelementptr inbounds i16, ptr %pkb, i32 %bo{j}",
           f"  %B{j} = call x86_amx @llvm.x86.tileloadd64.internal({tt}, ptr %bptr{j}, i64 {TILE_BYTES})"]
  for t in range(4):
    ln.append(f"  %d{t} = call x86_amx @llvm.x86.tdpbf16ps.internal({tt}, i16 {TILE_BYTES}, x86_amx %c{t}, "
              f"x86_amx %A{t // 2}, x86_amx %B{t % 2})")
  ln += ["  %kb.next = add i32 %kb, 1", "  br label %k.head", "k.exit:",
         "  br i1 %last, label %st.out, label %st.acc", "st.acc:"]
  for t in range(4):
    ln += [f"  %so{t} = add i32 %accb, {t * 256}", f"  %sp{t} = getelementptr inbounds float, ptr %acc, i32 %so{t}",
           f"  call void @llvm.x86.tilestored64.internal({tt}, ptr %sp{t}, i64 {TILE_BYTES}, x86_amx %c{t})"]
  ln += ["  br label %st.done", "st.out:"]
  for t in range(4):  # C tile t = (row half t//2, column half t%2), row stride N*4 bytes
    ln += [f"  %or{t} = add i32 %row0, {TILE_ROWS * (t // 2)}", f"  %orow{t} = mul i32 %or{t}, {n}",
           f"  %oc{t} = add i32 %bc0, {TILE_ROWS * (t % 2)}", f"  %oi{t} = add i32 %orow{t}, %oc{t}"]
    if out_bf16: ln += _bf16_epilogue(t, n, tt)
    else: ln += [f"  %op{t} = getelementptr inbounds float, ptr %out, i32 %oi{t}",
                 f"  call void @llvm.x86.tilestored64.internal({tt}, ptr %op{t}, i64 {n * 4}, x86_amx %c{t})"]
  ln += ["  br label %st.done", "st.done:", "  %rb.next = add i32 %rb, 1", "  br label %rb.head",
         "rb.exit:", "  %kc.next = add i32 %kc, 1", "  br label %kc.head",
         "kc.exit:", "  %g.next = add i32 %g, 1", "  br label %g.head",
         "g.exit:", "  %cb.next = add i32 %cb, 1", "  br label %cb.head", "done:", "  ret void", "}",
         'attributes #0 = { nounwind "target-features"="+amx-tile,+amx-bf16,+avx512f,+avx512bw" }']
  return "\n".join(ln) + "\n"


def _pack_panel(n: int, k: int) -> list[str]:
  """Blocks pack.head .. pack.exit: B's 32 columns from %bc0, rows 2p and 2p+1 for each k-pair p, interleaved into
  %pk as (2, K/2, 16, 2): columns 0-15 (panel 0) then 16-31 (panel 1), each k-pair's 16 columns x 2 values 64 bytes
  (the B operand layout of TDPBF16PS). One 64-byte load per B row and two shuffles per k-pair."""
  lo = ", ".join(f"i32 {c}, i32 {c + 32}" for c in range(16))
  hi = ", ".join(f"i32 {c}, i32 {c + 32}" for c in range(16, 32))
  return ["pack.head:", "  %p = phi i32 [0, %pack.pre], [%p.next, %pack.body]", f"  %p.ok = icmp slt i32 %p, {k // 2}",
          "  br i1 %p.ok, label %pack.body, label %pack.exit", "pack.body:",
          f"  %pr = mul i32 %p, {2 * n}", "  %pi0 = add i32 %pr, %bc0", f"  %pi1 = add i32 %pi0, {n}",
          "  %pq0 = getelementptr inbounds i16, ptr %b, i32 %pi0",
          "  %pq1 = getelementptr inbounds i16, ptr %b, i32 %pi1",
          "  %pv0 = load <32 x i16>, ptr %pq0, align 2", "  %pv1 = load <32 x i16>, ptr %pq1, align 2",
          f"  %plo = shufflevector <32 x i16> %pv0, <32 x i16> %pv1, <32 x i32> <{lo}>",
          f"  %phv = shufflevector <32 x i16> %pv0, <32 x i16> %pv1, <32 x i32> <{hi}>",
          "  %pd = mul i32 %p, 32", "  %pw0 = getelementptr inbounds i16, ptr %pk, i32 %pd",
          f"  %pd1 = add i32 %pd, {k * 16}", "  %pw1 = getelementptr inbounds i16, ptr %pk, i32 %pd1",
          "  store <32 x i16> %plo, ptr %pw0, align 64", "  store <32 x i16> %phv, ptr %pw1, align 64",
          "  %p.next = add i32 %p, 1", "  br label %pack.head", "pack.exit:",
          "  %pkb = getelementptr inbounds i16, ptr %pk, i32 0", "  br label %g.head"]


def _splat(v: int) -> str: return "<i32 " + ", i32 ".join([str(v)] * 16) + ">"


def round_bf16_ir(x: str, val: str) -> list[str]:
  """LLVM IR lines rounding `<16 x float>` value `val` to bfloat16 bits as tiny's cast rounds, into `<16 x i16>`
  `{x}v` (names `{x}...`): (bits + 0x7FFF + (bits >> 16 & 1)) >> 16 (ties to even; denormals round like any value),
  NaN -> 0x7FC0. Shared by the AMX and `vdpbf16ps` (`x86_bf16`) kernels' bfloat16 outputs."""
  return [f"  {x}n = fcmp uno <16 x float> {val}, {val}", f"  {x}b = bitcast <16 x float> {val} to <16 x i32>",
          f"  {x}s = lshr <16 x i32> {x}b, {_splat(16)}", f"  {x}l = and <16 x i32> {x}s, {_splat(1)}",
          f"  {x}a = add <16 x i32> {x}l, {_splat(0x7FFF)}", f"  {x}d = add <16 x i32> {x}b, {x}a",
          f"  {x}h = lshr <16 x i32> {x}d, {_splat(16)}",
          f"  {x}q = select <16 x i1> {x}n, <16 x i32> {_splat(0x7FC0)}, <16 x i32> {x}h",
          f"  {x}v = trunc <16 x i32> {x}q to <16 x i16>"]


def _bf16_epilogue(t: int, n: int, tt: str) -> list[str]:
  """C tile t stored to the stack buffer, then each of its 16 rows rounded to bfloat16 bits (`round_bf16_ir`) and
  stored at out + %oi{t} + row * n."""
  ln = [f"  call void @llvm.x86.tilestored64.internal({tt}, ptr %cbuf, i64 {TILE_BYTES}, x86_amx %c{t})"]
  for r in range(TILE_ROWS):
    v = f"%e{t}_{r}"
    ln += [f"  {v}p = getelementptr inbounds float, ptr %cbuf, i32 {r * 16}",
           f"  {v}f = load <16 x float>, ptr {v}p, align 64", *round_bf16_ir(v, f"{v}f"),
           f"  {v}i = add i32 %oi{t}, {r * n}",
           f"  {v}w = getelementptr inbounds i16, ptr %out, i32 {v}i", f"  store <16 x i16> {v}v, ptr {v}w, align 2"]
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


def stack_bytes(k: int) -> int:
  """The kernel's stack frame for K = `k`: the packed panel pair (64 bytes a k), the C tiles of a row group between K
  blocks (`GROUP_MAX` x 4 KB) and the bf16 epilogue's 1 KB tile buffer."""
  return k * PANEL_BYTES_PER_K + GROUP_MAX * BLOCK * BLOCK * 4 + 1024


def thread_stack_limit() -> int:
  """Bytes of stack the CPU runtime's threads get: `threading.stack_size()` when a program set one, else the soft
  `RLIMIT_STACK` (what glibc gives a new thread; 8 MB when unlimited, glibc's x86-64 default)."""
  if (size := threading.stack_size()) > 0: return size
  soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
  return 8 << 20 if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def fits(m: int, n: int, k: int) -> bool:
  """Whether the kernel's blocks divide an (m, k) @ (k, n) product (M, N and K multiples of 32), its i32 offsets
  hold it, K is at most `MAX_K` and its stack frame (`stack_bytes`) takes at most a quarter of a thread's stack
  (`thread_stack_limit`): the shapes `Tensor.dot` sends here."""
  return all(isinstance(v, int) and v > 0 and v % BLOCK == 0 for v in (m, n, k)) and \
    max(m * k, m * n, n * k) < 2 ** 31 and k <= MAX_K and 4 * stack_bytes(k) <= thread_stack_limit()


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
  """(M, N, K, out_bf16) of `match_matmul_layout(ast)`, or None."""
  got = match_matmul_layout(ast)
  return None if got is None else got[:4]


def match_matmul_layout(ast: UOp, any_size: bool = False) -> tuple[int, int, int, bool, int] | None:
  """(M, N, K, out_bf16, lda) when kernel AST `ast` is exactly what this kernel computes, with PARAM 0 the out (M, N):
  float32, or bfloat16 when the STORE holds a CAST of the sum to bfloat16 (out_bf16 True), PARAM 1 A (M, K) and
  PARAM 2 B (K, N), both bfloat16 and row-major (A's rows `lda` >= K elements apart: K, or more where `Tensor.dot`
  padded them, `a_row_pad`): one STORE of REDUCE-ADD over k of the float32 casts' product, every index affine in the
  three ranges (m, n, k) with the layouts' strides (checked per range, so the match is exact, not sampled), and
  `fits(M, N, K)` (`any_size`: any size, for `tiny_codegen.x86_bf16`'s kernel, which checks its own). None for
  anything else (it is lowered as usual)."""
  if ast.op is not Ops.SINK or len(ast.src) != 1 or (st := ast.src[0]).op is not Ops.STORE or len(st.src) != 2:
    return None
  oix, red = st.src
  out_bf16 = red.op is Ops.CAST and red.dtype == dtypes.bfloat16
  if out_bf16: red = red.src[0]
  if oix.op is not Ops.INDEX or len(oix.src) != 2 or oix.src[0].op is not Ops.PARAM: return None
  if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or red.dtype != dtypes.float32 or len(red.src) != 2: return None
  if (mul := red.src[0]).op is not Ops.MUL or (la := _bf16_load(mul.src[0])) is None or \
     (lb := _bf16_load(mul.src[1])) is None: return None
  if la[0].arg == 2: la, lb = lb, la  # B * A: the product commutes
  params = (oix.src[0], la[0], lb[0])
  if [p.arg for p in params] != [0, 1, 2] or not all(isinstance(p.dtype, PtrDType) for p in params) or \
     params[0].dtype.base != (dtypes.bfloat16 if out_bf16 else dtypes.float32): return None
  rk = red.src[1]
  outs = sorted({u for u in oix.src[1].toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
  rngs = [*outs, rk]
  if len(outs) != 2 or any(r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST for r in rngs) or \
     any(r.arg[1] is not AxisType.LOOP for r in outs): return None
  so, sa, sb = (_affine_strides(i, rngs) for i in (oix.src[1], la[1], lb[1]))
  if so is None or sa is None or sb is None: return None
  rm, rn = outs
  size = {r: int(r.src[0].arg) for r in rngs}
  m, n, k = size[rm], size[rn], size[rk]
  lda = sa[rm]
  want = {rm: (n, lda, 0), rn: (1, 0, 1), rk: (0, 1, n)}
  if lda < k or any((so[r], sa[r], sb[r]) != w for r, w in want.items()): return None
  if not any_size and (m * lda >= 2 ** 31 or not fits(m, n, k)): return None
  for p, need in zip(params, (m * n, (m - 1) * lda + k, n * k)):
    if not isinstance(p.dtype, PtrDType) or p.dtype.size < need: return None
  return m, n, k, out_bf16, lda


A_PAD_COPY_SHARE = 32
"""The copy of A that `a_row_pad` asks for is paid for when it is at most 1/this of the tile kernel's reads of A
(see `A_PAD_MIN_COLUMNS`): the copy passes over A at streaming speed where the kernel's passes wait on tile loads,
so the two are counted in passes, and a 1/32 share keeps the copy under the smallest gain the padded rows measured
(4-9% at K=1024, 8-10% at K=2048, 12-27% at K=4096 on the Xeon 6/207, `a_row_pad`). A ratio of costs, not a cache
or tile size: the one number of this rule that is not the machine's or the tile format's."""
A_PAD_COPY_PASSES = 2
"""Passes over A the pad copy makes: one read, one write (`Tensor.dot`'s `pad(...).contiguous()`)."""
A_PAD_MIN_COLUMNS = A_PAD_COPY_PASSES * A_PAD_COPY_SHARE * BLOCK
"""The columns (N) from which `a_row_pad` pads A's rows, a property of the tile kernel's loop order: its outermost
loop walks B's column blocks of `BLOCK` (two C tiles' 16 columns, the AMX palette's `TILE_BYTES` of float32 each), and
each column block reads the thread's whole share of A once, so a product reads A N / BLOCK times; the copy passes
over it `A_PAD_COPY_PASSES` times, and pays from N / BLOCK >= `A_PAD_COPY_PASSES` x `A_PAD_COPY_SHARE`: 2048 columns
(64 passes over A). Not a cache size, so no machine model changes it: a 1024^2 product (32 passes) reads A in place
on every CPU, a 4096^2 one (128) is padded wherever its rows share too few L1d sets."""


def a_row_pad(n: int, k: int, set_span: int, ways: int) -> int:
  """Elements to pad each row of A (M, K) bfloat16 by before the tile kernel (0: read it in place), for an L1d of
  `ways` ways whose addresses map to the same set again every `set_span` bytes (`Machine.l1d_set_span`). Each k step
  loads two A tiles, 32 rows of 64 bytes K*2 bytes apart, and prefetches the next step's 32 rows into L1: those rows
  fall into set_span / gcd(K*2, set_span) sets, and when those sets' ways are fewer than the 32 rows, the rows evict
  each other before the tiles read them (a 48 KB 12-way L1d, 4 KB span: K=4096 or 2048, every row in one set; K=1024,
  two sets of 12). One cache line (32 values) more a row spreads them over 32 sets. Measured on the Xeon 6/207 (one
  thread, thread CPU time, the kernel alone on 1024 x K @ K x 1024, in turns, load ~6.5, three runs): K=4096 481,
  339, 496 GFLOPS against K=4128's 572, 429, 579; K=2048 369, 570 against K=2080's 411, 624; K=1024 385, 648, 748
  against K=1056's 413, 708, 774. Padded from `A_PAD_MIN_COLUMNS` columns (the copy's cost against that gain)."""
  if set_span <= 0 or ways <= 0 or n < A_PAD_MIN_COLUMNS: return 0
  sets = set_span // math.gcd(k * 2, set_span)
  return K_STEP if sets * ways < 2 * TILE_ROWS else 0


def pack_b(k: int, n: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
  """How a (K, N) B becomes the kernel's panels (`b_packed`) and back, as movement ops: (the reshape of B,
  the permute that makes the panels (N/32, 2, K/2, 16, 2) of it, the permute that makes them (K/2, 2, N/32, 2, 16)
  again, to reshape to (K, N)). Element [cb, j, p, c, e] of the panels is B[2p + e, 32cb + 16j + c]."""
  if k % 2 or n % BLOCK: raise ValueError(f"pack_b: a {k}x{n} B; valid: K even, N a multiple of {BLOCK}")
  return (k // 2, 2, n // BLOCK, 2, TILE_ROWS), (2, 3, 0, 4, 1), (2, 4, 0, 1, 3)


# kernel AST sources -> (M, N, K): bf16 products over a B in the kernel's panels (`b_packed`), registered by the
# Tensor code that lays such a B out (`tiny_tensor.llm`'s prefill weights) and scheduled over placeholders per shape
_PACKED: dict[tuple[UOp, ...], tuple[int, int, int]] = {}


def register_packed_b(ast: UOp, m: int, n: int, k: int) -> None:
  """Record that kernel AST `ast` (a SINK, PARAMs out, A, packed B in that order) computes the float32 (M, N) product
  of a bfloat16 A (M, K) and a B held in the kernel's panels (`pack_b`), so `tiny_codegen.program` runs the tile
  kernel with `b_packed` for it. ValueError for a non-SINK or a shape the kernel doesn't take (`fits`)."""
  if ast.op is not Ops.SINK: raise ValueError(f"register_packed_b needs a kernel AST (SINK), got {ast.op}")
  if not fits(m, n, k): raise ValueError(f"register_packed_b: {m}x{k} @ {k}x{n} doesn't fit the tile kernel")
  _PACKED[ast.src] = (m, n, k)


def registered_packed_b(ast: UOp) -> tuple[int, int, int] | None:
  """(M, N, K) of a kernel AST registered with `register_packed_b` (its KernelInfo aside), else None."""
  return _PACKED.get(ast.src) if ast.op is Ops.SINK else None
