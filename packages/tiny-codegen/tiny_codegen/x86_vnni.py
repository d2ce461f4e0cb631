"""Int8 dot products on x86-64 CPUs with VNNI (issue #39): a Q8_0 matvec kernel's LLVM IR built on `vpdpbusd`
(four u8 x s8 products summed into each int32 lane), and the kernel AST it stands in for.

Reached from `tiny_tensor.llm` (a Q8_0 weight times one token's activations, quantized to int8 per block of 32 as
llama.cpp does): the Tensor graph `q8_0_matvec_ast` describes is

    out[o] = sum_{b, i} float(int8(raw[o, b, 2 + i]) * xq[b, i]) * f16(raw[o, b, 0:2]) * xd[b]

(one float32 sum of exact products times both scales; the kernel below sums each block's products exactly in int32
first, then scales: the same value up to float32 rounding), and `tiny_codegen.program` hands a kernel AST equal to
it to `q8_0_matvec_ir`'s kernel instead of lowering it, on the LLVM CPU renderer of a machine whose `Machine.isa`
lists `avx512_vnni` with `avx512vl`, or `avx_vnni` (`vnni_form`). Elsewhere (no VNNI, another renderer, CHECK_OOB)
the same AST is lowered as usual: plain int32 math, the same sums. Why a whole kernel, not an op the lowering
vectorizes: the optimizer puts blocks, not lanes, in the vector for this reduce (bench/README.md, "Quantized
matvec"), and LLVM never forms `vpdpbusd` from widened int math.

The kernel, `void <name>(float *out, uint8 *raw, int8 *xq, float *xd, i32 core_id)`, one call per thread `core_id`
of `threads`, computes rows [core_id * O/threads, (core_id+1) * O/threads):
- `raw`: the weight's Q8_0 blocks, (O, NB, 34) bytes: a little-endian float16 scale, then 32 int8 values;
- `xq`: the activations, (NB, 32) int8; `xd`: their scales, (NB,) float32;
- `out`: (O,) float32.
`vpdpbusd` multiplies unsigned bytes by signed ones, so the weight's bytes go in offset by 128 (`xor 0x80`) and each
block's int32 lanes start from -128 * sum(xq[b]) (computed once per call into a stack array): sum((w + 128) * x) -
128 * sum(x) = sum(w * x), exact. Per block and row: one 32-byte weight load, `vpxor`, `vpdpbusd` (8 int32 lanes),
`vcvtdq2ps`, one FMA with the block's scale f16(w) * xd[b] into 8 float32 lanes kept across the K loop; one
horizontal sum per row at the end. `ROWS` rows share each activation block load (one: a thread reads its weight
bytes as one stream, see `ROWS`); with `ahead` > 0 both kernels prefetch each row's block that many bytes ahead.
"""
from __future__ import annotations

from tiny_uop.dtype import dtypes
from tiny_uop.uop import AxisType, Ops, UOp

from tiny_codegen import cpu_probe
from tiny_codegen.matvec_ir import group_rows, row_groups

__all__ = ["Q8_0_BYTES", "Q4_K_BYTES", "vnni_form", "q8_0_matvec_ir", "q8_0_matvec_ast", "match_q8_0_matvec",
           "q4_k_matvec_ir", "register_kernel", "registered_kernel"]

Q8_0_BYTES = 34
"""Bytes of one Q8_0 block: a float16 scale and 32 int8 values (ggml-common.h `block_q8_0`)."""
ROWS = 1
"""Rows of the weight one K loop runs together (sharing each activation load). One: a decode step reads every weight
byte once from L3 or memory, and the hardware prefetchers follow a thread's rows read one after another as one
contiguous stream, while `rows` rows side by side are `rows` streams a row long (K=768 Q8_0: 13 lines), each ended
before the prefetcher runs ahead, the next group's rows starting cold. The activations sit in L1, so sharing their
loads saved little. Zen 4 (EPYC fam 25 model 17), one thread, 24 weights in turn (40 MB, over the 32 MB L3), thread
CPU time a matvec: Q8_0 2048x768 4 rows 175-183 us (9.5 GB/s) -> 1 row 70-92 us (19-24 GB/s), 768x2048 129-136 ->
70 us; Q4_K 2048x768 70-72 -> 62-64 us, 768x2048 96-102 -> 55-60 us (Q4_K is compute-bound there). The 4-row form
with a software prefetch of the next row group (2-3x over 4 rows without one on the Xeon 6/207, session 8) stays
below one row on Zen 4 (2 or 4 groups ahead: the same 9.7 GB/s). One row needs no software prefetch here (`ahead`
0): the F32 kernel's distance (`matvec_ir.prefetch_ahead`, 16 KB) made the 12-layer bench decode step slower, Q8_0
5.3-6.7 -> 7.1-7.7 ms, Q4_K 3.9-4.6 -> 4.6-4.8 (one thread, thread CPU time, load 11): a Q8_0 block's 34 bytes ask
for a line twice, a Q4_K block's 144 three prefetches."""
# (target features, intrinsic): AVX512-VNNI's 256-bit form needs AVX512VL; AVX-VNNI (Alder Lake and later) is the
# VEX encoding of the same instruction, which LLVM selects from the same intrinsic under +avxvnni.
_FORMS = {"avx512_vnni": ("+avx512vnni,+avx512vl", "llvm.x86.avx512.vpdpbusd.256"),
          "avx_vnni": ("+avxvnni", "llvm.x86.avx512.vpdpbusd.256")}


def vnni_form(isa: frozenset[str] | set[str], probe: bool = True) -> str | None:
  """Which VNNI form a machine with cpuinfo flags `isa` (`Machine.isa`) runs: "avx512_vnni" (with AVX512VL),
  "avx_vnni", or None (no int8 dot-product instruction: lower the plain int32 math instead). `probe`: a form counts
  only where `tiny_codegen.cpu_probe` also ran its `vpdpbusd` in a child process (`TINY_CPU_PROBE=0`: never)."""
  for form, flags in (("avx512_vnni", ("avx512_vnni", "avx512vl")), ("avx_vnni", ("avx_vnni",))):
    if all(f in isa for f in flags) and (not probe or cpu_probe.executes(form, frozenset(isa))): return form
  return None


def _check(o: int, nb: int, threads: int) -> None:
  for name, v in (("O", o), ("NB", nb), ("threads", threads)):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"q8_0_matvec_ir: {name} must be a positive int, got {v!r}")
  if o % threads: raise ValueError(f"q8_0_matvec_ir: O={o} rows must split evenly over threads={threads}")
  if o * nb * Q8_0_BYTES >= 2 ** 31:  # the byte offsets are i32
    raise ValueError(f"q8_0_matvec_ir: {o}x{nb} blocks are 2**31 bytes or more; valid: fewer")


def _prefetch(r: int, ahead: int, lines: int) -> list[str]:
  """IR: prefetch (`llvm.prefetch`, read, into L1) `lines` 64-byte lines from `ahead` bytes past row r's block
  pointer `%wp<r>` (none for `ahead` 0). No `inbounds`: past the weight's end the address is never read (a prefetch
  doesn't fault)."""
  if ahead <= 0: return []
  ln = []
  for i in range(lines):
    ln += [f"  %pf{r}_{i} = getelementptr i8, ptr %wp{r}, i64 {ahead + 64 * i}",
           f"  call void @llvm.prefetch.p0(ptr %pf{r}_{i}, i32 0, i32 3, i32 1)"]
  return ln


def q8_0_matvec_ir(o: int, nb: int, threads: int = 1, name: str = "q8_0_matvec", form: str = "avx512_vnni",
                   rows: int = ROWS, ahead: int = 0) -> str:
  """The LLVM IR module of the Q8_0 matvec kernel described in the module docstring: O rows of NB blocks, split
  into `threads` row shares, `rows` rows a K loop (fewer where a share doesn't divide), each row's block prefetched
  `ahead` bytes on (0: none), with `form` one of `vnni_form`'s answers. ValueError for a bad shape or form. Only run
  what it compiles to on a CPU that has `form`.

  >>> "@llvm.x86.avx512.vpdpbusd.256(" in q8_0_matvec_ir(8, 2)
  True
  """
  _check(o, nb, threads)
  if form not in _FORMS: raise ValueError(f"q8_0_matvec_ir: form {form!r} is not one of {sorted(_FORMS)}")
  features, fn = _FORMS[form]
  per = o // threads
  rows = group_rows(per, rows)
  v8f, v8i, b = "<8 x float>", "<8 x i32>", Q8_0_BYTES
  ln = [f"declare {v8i} @{fn}({v8i}, {v8i}, {v8i})", "declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)",
        f"declare float @llvm.vector.reduce.fadd.v8f32(float, {v8f})",
        f"declare {v8f} @llvm.fma.v8f32({v8f}, {v8f}, {v8f})", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
        f"define void @{name}(ptr noalias %out, ptr noalias %raw, ptr noalias %xq, ptr noalias %xd, "
        "i32 %core_id) #0 {",
        "entry:", f"  %corr = alloca [{nb} x i32], align 64", "  br label %s.head",
        # -128 * sum(xq[b]) per block: the u8 offset's correction, the start of every row's lanes for block b
        "s.head:", "  %sb = phi i32 [0, %entry], [%sb.next, %s.body]", f"  %s.ok = icmp slt i32 %sb, {nb}",
        "  br i1 %s.ok, label %s.body, label %r.pre",
        "s.body:", "  %so = mul i32 %sb, 32", "  %sp = getelementptr inbounds i8, ptr %xq, i32 %so",
        "  %sv = load <32 x i8>, ptr %sp, align 1", "  %sw = sext <32 x i8> %sv to <32 x i32>",
        "  %ss = call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> %sw)", "  %sc = mul i32 %ss, -128",
        "  %scp = getelementptr inbounds i32, ptr %corr, i32 %sb", "  store i32 %sc, ptr %scp, align 4",
        "  %sb.next = add i32 %sb, 1", "  br label %s.head",
        *row_groups(per, rows, nb * b, "i8", "%raw")]
  ln += ["  br label %k.head", "k.head:", "  %kb = phi i32 [0, %k.pre], [%kb.next, %k.body]"]
  ln += [f"  %a{r} = phi {v8f} [zeroinitializer, %k.pre], [%a{r}.n, %k.body]" for r in range(rows)]
  ln += [f"  %k.ok = icmp slt i32 %kb, {nb}", "  br i1 %k.ok, label %k.body, label %k.exit",
         "k.body:", "  %xo = mul i32 %kb, 32", "  %xp = getelementptr inbounds i8, ptr %xq, i32 %xo",
         f"  %xv = load {v8i}, ptr %xp, align 1", "  %cp = getelementptr inbounds i32, ptr %corr, i32 %kb",
         "  %cs = load i32, ptr %cp, align 4", f"  %cv = insertelement {v8i} zeroinitializer, i32 %cs, i32 0",
         "  %dxp = getelementptr inbounds float, ptr %xd, i32 %kb", "  %dx = load float, ptr %dxp, align 4",
         f"  %bo = mul i32 %kb, {b}"]
  for r in range(rows):
    ln += [f"  %wp{r} = getelementptr inbounds i8, ptr %rp{r}, i32 %bo",
           *_prefetch(r, ahead, 1),
           f"  %dh{r} = load half, ptr %wp{r}, align 1", f"  %df{r} = fpext half %dh{r} to float",
           f"  %s{r} = fmul float %df{r}, %dx", f"  %qp{r} = getelementptr inbounds i8, ptr %wp{r}, i32 2",
           f"  %qv{r} = load <32 x i8>, ptr %qp{r}, align 1",
           f"  %qu{r} = xor <32 x i8> %qv{r}, <{', '.join(['i8 -128'] * 32)}>",
           f"  %qi{r} = bitcast <32 x i8> %qu{r} to {v8i}",
           f"  %d{r} = call {v8i} @{fn}({v8i} %cv, {v8i} %qi{r}, {v8i} %xv)",
           f"  %f{r} = sitofp {v8i} %d{r} to {v8f}", f"  %si{r} = insertelement {v8f} poison, float %s{r}, i32 0",
           f"  %sv{r} = shufflevector {v8f} %si{r}, {v8f} poison, <8 x i32> zeroinitializer",
           f"  %a{r}.n = call {v8f} @llvm.fma.v8f32({v8f} %f{r}, {v8f} %sv{r}, {v8f} %a{r})"]
  ln += ["  %kb.next = add i32 %kb, 1", "  br label %k.head", "k.exit:"]
  for r in range(rows):
    ln += [f"  %h{r} = call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, {v8f} %a{r})",
           f"  %op{r} = getelementptr inbounds float, ptr %out, i32 %row{r}",
           f"  store float %h{r}, ptr %op{r}, align 4"]
  ln += ["  %rg.next = add i32 %rg, 1", "  br label %r.head", "done:", "  ret void", "}",
         f'attributes #0 = {{ nounwind "target-features"="{features}" }}']
  return "\n".join(ln) + "\n"


def _c(v: int, dt=dtypes.int32) -> UOp: return UOp.const(dt, v)


def q8_0_matvec_ast(o: int, nb: int) -> UOp:
  """The kernel AST (a SINK without its KernelInfo) that the scheduler makes of the Q8_0 matvec graph in the module
  docstring (PARAM 0 out (O,) float32, 1 raw (O*NB*34,) uint8, 2 xq (NB*32,) int8, 3 xd (NB,) float32): the one
  form `match_q8_0_matvec` hands to the VNNI kernel."""
  out, raw = UOp(Ops.PARAM, dtypes.float32.ptr(o), arg=0), UOp(Ops.PARAM, dtypes.uint8.ptr(o * nb * Q8_0_BYTES), arg=1)
  xq, xd = UOp(Ops.PARAM, dtypes.int8.ptr(nb * 32), arg=2), UOp(Ops.PARAM, dtypes.float32.ptr(nb), arg=3)
  ro = UOp(Ops.RANGE, dtypes.int32, (_c(o),), (0, AxisType.LOOP))
  rb = UOp(Ops.RANGE, dtypes.int32, (_c(nb),), (1, AxisType.REDUCE))
  ri = UOp(Ops.RANGE, dtypes.int32, (_c(32),), (2, AxisType.REDUCE))
  base = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.MUL, dtypes.int32, (ro, _c(nb * Q8_0_BYTES))),
                                     UOp(Ops.MUL, dtypes.int32, (rb, _c(Q8_0_BYTES)))))

  def load(p: UOp, idx: UOp) -> UOp: return UOp(Ops.LOAD, p.dtype.base, (UOp(Ops.INDEX, p.dtype, (p, idx)),))
  qi = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (base, ri)), _c(2)))
  wq = load(raw, qi).bitcast(dtypes.int8).cast(dtypes.int32)
  xi = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.MUL, dtypes.int32, (rb, _c(32))), ri))
  prod = UOp(Ops.MUL, dtypes.int32, (wq, load(xq, xi).cast(dtypes.int32))).cast(dtypes.float32)
  lo = load(raw, base).cast(dtypes.uint16)
  hi = load(raw, UOp(Ops.ADD, dtypes.int32, (base, _c(1)))).cast(dtypes.uint16)
  dw = UOp(Ops.OR, dtypes.uint16, (lo, UOp(Ops.SHL, dtypes.uint16, (hi, _c(8, dtypes.uint16))))).bitcast(
    dtypes.float16).cast(dtypes.float32)
  term = UOp(Ops.MUL, dtypes.float32, (UOp(Ops.MUL, dtypes.float32, (prod, dw)), load(xd, rb)))
  red = UOp(Ops.REDUCE, dtypes.float32, (term, rb, ri), Ops.ADD)
  return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, ro)), red)),))


def match_q8_0_matvec(ast: UOp) -> tuple[int, int] | None:
  """(O, NB) when kernel AST `ast` is exactly `q8_0_matvec_ast(O, NB)` (its KernelInfo aside), else None (then it
  is lowered as usual). The sizes are read from the out and xd PARAMs, the AST built for them and compared: equal
  UOps are the same object, so the match is exact."""
  if ast.op is not Ops.SINK or len(ast.src) != 1 or (st := ast.src[0]).op is not Ops.STORE or len(st.src) != 2:
    return None
  red = st.src[1]
  if red.op is not Ops.REDUCE or red.dtype != dtypes.float32 or len(red.src) != 3 or red.src[0].op is not Ops.MUL:
    return None
  oix, xl = st.src[0], red.src[0].src[1]
  if oix.op is not Ops.INDEX or xl.op is not Ops.LOAD or xl.src[0].op is not Ops.INDEX: return None
  o, nb = getattr(oix.src[0].dtype, "size", -1), getattr(xl.src[0].src[0].dtype, "size", -1)
  if not isinstance(o, int) or not isinstance(nb, int) or o <= 0 or nb <= 0: return None
  if o * nb * Q8_0_BYTES >= 2 ** 31: return None
  return (o, nb) if q8_0_matvec_ast(o, nb).src == ast.src else None


# ***** Q4_K: super-blocks of 256 (8 sub-blocks of 32 with 6-bit scales and mins), nibbles u8 x int8 activations *****
Q4_K_BYTES = 144
"""Bytes of one Q4_K super-block: float16 d and dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles
(ggml-common.h `block_q4_K`)."""


def _i8s(*v: int) -> str: return "<" + ", ".join(f"i8 {x}" for x in v) + ">"
def _i32s(*v: int) -> str: return "<" + ", ".join(f"i32 {x}" for x in v) + ">"


def _q4k_scales(r: int) -> list[str]:
  """IR: row r's eight 6-bit scales and eight mins as <8 x i16> %sc{r} and %mn{r}, from the 32-bit words w0, w1, w2
  of the block's 12 scale bytes (%b{r}, <4 x i32> loaded at byte 4; its fourth word is nibbles, unused). ggml's
  get_scale_min_k4 per byte, four bytes a word: scales 0..3 = w0 & 0x3f, 4..7 = (w2 & 0x0f) | (w0 >> 6) << 4; mins
  0..3 = w1 & 0x3f, 4..7 = (w2 >> 4) | (w1 >> 6) << 4 (each byte's top two bits of w0, w1 become bits 4..5). One
  <4 x i32> does all four words: ((P >> s) & m1) | ((Q >> 2) & m2) with P = (w0, w2, w1, w2), Q = (w0, w0, w1, w1)."""
  k1, k2, k3 = 0x3f3f3f3f, 0x0f0f0f0f, 0x30303030
  return [
    f"  %P{r} = shufflevector <4 x i32> %b{r}, <4 x i32> poison, <4 x i32> {_i32s(0, 2, 1, 2)}",
    f"  %Q{r} = shufflevector <4 x i32> %b{r}, <4 x i32> poison, <4 x i32> {_i32s(0, 0, 1, 1)}",
    f"  %Ps{r} = lshr <4 x i32> %P{r}, {_i32s(0, 0, 0, 4)}",
    f"  %Pm{r} = and <4 x i32> %Ps{r}, {_i32s(k1, k2, k1, k2)}",
    f"  %Qs{r} = lshr <4 x i32> %Q{r}, {_i32s(2, 2, 2, 2)}", f"  %Qm{r} = and <4 x i32> %Qs{r}, {_i32s(0, k3, 0, k3)}",
    f"  %R{r} = or <4 x i32> %Pm{r}, %Qm{r}", f"  %Rb{r} = bitcast <4 x i32> %R{r} to <16 x i8>",  # scales, mins
    f"  %Rs{r} = shufflevector <16 x i8> %Rb{r}, <16 x i8> poison, <8 x i32> {_i32s(*range(8))}",
    f"  %Rm{r} = shufflevector <16 x i8> %Rb{r}, <16 x i8> poison, <8 x i32> {_i32s(*range(8, 16))}",
    f"  %sc{r} = zext <8 x i8> %Rs{r} to <8 x i16>", f"  %mn{r} = zext <8 x i8> %Rm{r} to <8 x i16>"]


def q4_k_matvec_ir(o: int, ns: int, threads: int = 1, name: str = "q4_k_matvec", form: str = "avx512_vnni",
                   order: tuple[str, ...] = ("out", "raw", "xq", "xd"), rows: int = ROWS, ahead: int = 0) -> str:
  """The LLVM IR module of a Q4_K matvec: O rows of NS super-blocks (`raw`: (O, NS, 144) bytes) times activations
  quantized per super-block (`xq` (NS*256,) int8, `xd` (NS,) float32: one scale per 256 values, as llama.cpp's Q8_K),
  split into `threads` row shares; the kernel's pointer arguments in `order` (then i32 core_id); `rows` and `ahead`
  as in `q8_0_matvec_ir`. Per super-block and row, all in int32 and exact: each sub-block j's nibbles (0..15) times
  its 32 activations (`vpmaddubsw`: u8 x s8 pairs summed into int16, |sum| <= 2 * 15 * 128), times the sub-block's
  6-bit scale and summed into int32 lanes (`vpdpwssd`: two chains, even and odd sub-blocks); the mins' sum_j min_j *
  sum(xq[j]) (`pmaddwd` over the eight mins and a per-call table of the activations' int16 sums per 32). Then two
  float32 FMAs: d * xd times the scaled sum into 8 lanes, dmin * xd times the mins' sum into 4; one horizontal sum
  each per row. ggml's `dequantize_row_q4_K` value d * sc_j * q - dmin * m_j times xd * xq, summed: the same up to
  float32 rounding (the int32 sums are exact: |sum| <= 8 * 63 * 32 * 15 * 127 < 2**31).

  >>> "@llvm.x86.avx512.vpdpwssd.256(" in q4_k_matvec_ir(4, 1)
  True
  """
  _check(o, ns, threads)
  if ns * Q4_K_BYTES * o >= 2 ** 31: raise ValueError(f"q4_k_matvec_ir: {o}x{ns} super-blocks are 2**31 bytes or more")
  if form not in _FORMS: raise ValueError(f"q4_k_matvec_ir: form {form!r} is not one of {sorted(_FORMS)}")
  if sorted(order) != ["out", "raw", "xd", "xq"]:
    raise ValueError(f"q4_k_matvec_ir: order {order!r} must name out, raw, xq and xd once each")
  features = _FORMS[form][0]
  per, nb, bb = o // threads, ns * 8, Q4_K_BYTES
  rows = group_rows(per, rows)
  v8f, v8i, v4f, v16s = "<8 x float>", "<8 x i32>", "<4 x float>", "<16 x i16>"
  args = ", ".join(f"ptr noalias %{a}" for a in order)
  ln = [f"declare {v8i} @llvm.x86.avx512.vpdpwssd.256({v8i}, {v8i}, {v8i})",
        f"declare {v16s} @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)",
        "declare <4 x i32> @llvm.x86.sse2.pmadd.wd(<8 x i16>, <8 x i16>)",
        "declare i16 @llvm.vector.reduce.add.v32i16(<32 x i16>)",
        f"declare float @llvm.vector.reduce.fadd.v8f32(float, {v8f})",
        f"declare float @llvm.vector.reduce.fadd.v4f32(float, {v4f})",
        f"declare {v8f} @llvm.fma.v8f32({v8f}, {v8f}, {v8f})", f"declare {v4f} @llvm.fma.v4f32({v4f}, {v4f}, {v4f})",
        "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
        f"define void @{name}({args}, i32 %core_id) #0 {{",
        "entry:", f"  %bs = alloca [{nb} x i16], align 64", "  br label %s.head",
        # sum(xq[b]) per 32-block as int16 (|sum| <= 32 * 128): what the mins multiply
        "s.head:", "  %sb = phi i32 [0, %entry], [%sb.next, %s.body]", f"  %s.ok = icmp slt i32 %sb, {nb}",
        "  br i1 %s.ok, label %s.body, label %r.pre",
        "s.body:", "  %so = mul i32 %sb, 32", "  %sp = getelementptr inbounds i8, ptr %xq, i32 %so",
        "  %sv = load <32 x i8>, ptr %sp, align 1", "  %sw = sext <32 x i8> %sv to <32 x i16>",
        "  %ss = call i16 @llvm.vector.reduce.add.v32i16(<32 x i16> %sw)",
        "  %bsp = getelementptr inbounds i16, ptr %bs, i32 %sb", "  store i16 %ss, ptr %bsp, align 2",
        "  %sb.next = add i32 %sb, 1", "  br label %s.head",
        *row_groups(per, rows, ns * bb, "i8", "%raw")]
  ln += ["  br label %k.head", "k.head:", "  %kb = phi i32 [0, %k.pre], [%kb.next, %k.body]"]
  for r in range(rows):
    ln += [f"  %a{r} = phi {v8f} [zeroinitializer, %k.pre], [%a{r}.n, %k.body]",
           f"  %m{r} = phi {v4f} [zeroinitializer, %k.pre], [%m{r}.n, %k.body]"]
  ln += [f"  %k.ok = icmp slt i32 %kb, {ns}", "  br i1 %k.ok, label %k.body, label %k.exit",
         "k.body:", "  %x0 = mul i32 %kb, 256", "  %blk0 = mul i32 %kb, 8",
         "  %xdp = getelementptr inbounds float, ptr %xd, i32 %kb", "  %xds = load float, ptr %xdp, align 4",
         "  %bsq = getelementptr inbounds i16, ptr %bs, i32 %blk0", "  %bsv = load <8 x i16>, ptr %bsq, align 2"]
  for j in range(8):
    ln += [f"  %xo{j} = add i32 %x0, {32 * j}", f"  %xp{j} = getelementptr inbounds i8, ptr %xq, i32 %xo{j}",
           f"  %xv{j} = load <32 x i8>, ptr %xp{j}, align 1"]
  ln.append(f"  %bo = mul i32 %kb, {bb}")
  for r in range(rows):
    ln += [f"  %wp{r} = getelementptr inbounds i8, ptr %rp{r}, i32 %bo",
           *_prefetch(r, ahead, -(-bb // 64)),
           f"  %dh{r} = load half, ptr %wp{r}, align 1", f"  %d{r} = fpext half %dh{r} to float",
           f"  %mp{r} = getelementptr inbounds i8, ptr %wp{r}, i32 2", f"  %mh{r} = load half, ptr %mp{r}, align 1",
           f"  %dm{r} = fpext half %mh{r} to float", f"  %bp{r} = getelementptr inbounds i8, ptr %wp{r}, i32 4",
           f"  %b{r} = load <4 x i32>, ptr %bp{r}, align 1"]
    ln += _q4k_scales(r)
    # the mins: sum_j min_j * bsum_j in 4 int32 lanes, times dmin * xd into 4 float lanes
    ln += [f"  %mq{r} = call <4 x i32> @llvm.x86.sse2.pmadd.wd(<8 x i16> %mn{r}, <8 x i16> %bsv)",
           f"  %mf{r} = sitofp <4 x i32> %mq{r} to {v4f}", f"  %mx{r} = fmul float %dm{r}, %xds",
           f"  %mi{r} = insertelement {v4f} poison, float %mx{r}, i32 0",
           f"  %mv{r} = shufflevector {v4f} %mi{r}, {v4f} poison, <4 x i32> zeroinitializer",
           f"  %m{r}.n = call {v4f} @llvm.fma.v4f32({v4f} %mf{r}, {v4f} %mv{r}, {v4f} %m{r})"]
    acc = {0: "zeroinitializer", 1: "zeroinitializer"}  # two int32 chains: even, odd
    for c in range(4):  # 32 bytes: sub-block 2c in the low nibbles, 2c+1 in the high ones
      ln += [f"  %qp{r}_{c} = getelementptr inbounds i8, ptr %wp{r}, i32 {16 + 32 * c}",
             f"  %qv{r}_{c} = load <32 x i8>, ptr %qp{r}_{c}, align 1",
             f"  %ql{r}_{c} = and <32 x i8> %qv{r}_{c}, {_i8s(*[15] * 32)}",
             f"  %qs{r}_{c} = lshr <32 x i8> %qv{r}_{c}, {_i8s(*[4] * 32)}"]
      for h, q in ((0, f"%ql{r}_{c}"), (1, f"%qs{r}_{c}")):
        j, t = 2 * c + h, f"{r}_{2 * c + h}"
        ln += [f"  %p{t} = call {v16s} @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {q}, <32 x i8> %xv{j})",
               f"  %pi{t} = bitcast {v16s} %p{t} to {v8i}",
               f"  %sj{t} = shufflevector <8 x i16> %sc{r}, <8 x i16> poison, <16 x i32> {_i32s(*[j] * 16)}",
               f"  %sji{t} = bitcast {v16s} %sj{t} to {v8i}",
               f"  %acc{t} = call {v8i} @llvm.x86.avx512.vpdpwssd.256({v8i} {acc[h]}, {v8i} %pi{t}, {v8i} %sji{t})"]
        acc[h] = f"%acc{t}"
    ln += [f"  %si{r} = add {v8i} {acc[0]}, {acc[1]}", f"  %sf{r} = sitofp {v8i} %si{r} to {v8f}",
           f"  %dx{r} = fmul float %d{r}, %xds", f"  %di{r} = insertelement {v8f} poison, float %dx{r}, i32 0",
           f"  %dv{r} = shufflevector {v8f} %di{r}, {v8f} poison, <8 x i32> zeroinitializer",
           f"  %a{r}.n = call {v8f} @llvm.fma.v8f32({v8f} %sf{r}, {v8f} %dv{r}, {v8f} %a{r})"]
  ln += ["  %kb.next = add i32 %kb, 1", "  br label %k.head", "k.exit:"]
  for r in range(rows):
    ln += [f"  %h{r} = call reassoc float @llvm.vector.reduce.fadd.v8f32(float -0.0, {v8f} %a{r})",
           f"  %hm{r} = call reassoc float @llvm.vector.reduce.fadd.v4f32(float -0.0, {v4f} %m{r})",
           f"  %y{r} = fsub float %h{r}, %hm{r}",
           f"  %op{r} = getelementptr inbounds float, ptr %out, i32 %row{r}",
           f"  store float %y{r}, ptr %op{r}, align 4"]
  ln += ["  %rg.next = add i32 %rg, 1", "  br label %r.head", "done:", "  ret void", "}",
         f'attributes #0 = {{ nounwind "target-features"="{features}" }}']
  return "\n".join(ln) + "\n"


# kernel AST sources -> (kind, O, blocks, pointer order): kernels registered by the Tensor code that builds their
# graph (`tiny_tensor.llm.quants.q4_k_matvec` schedules its graph over placeholders once per shape): the match is the
# interned AST itself, so exact, without a hand-written copy of a graph as long as the Q4_K decoding
_KERNELS: dict[tuple[UOp, ...], tuple[str, int, int, tuple[str, ...]]] = {}
KINDS = ("q4_k",)


def register_kernel(ast: UOp, kind: str, o: int, blocks: int, order: tuple[str, ...]) -> None:
  """Record that kernel AST `ast` (a SINK) computes `kind`'s matvec (one of KINDS: "q4_k", `q4_k_matvec_ir`) of O
  rows and `blocks` super-blocks with its PARAMs in `order` (names of the kernel's pointer arguments), so
  `tiny_codegen.program` runs that kernel for it on a VNNI machine. ValueError for an unknown kind or a non-SINK."""
  if kind not in KINDS: raise ValueError(f"register_kernel: kind {kind!r} is not one of {KINDS}")
  if ast.op is not Ops.SINK: raise ValueError(f"register_kernel needs a kernel AST (SINK), got {ast.op}")
  _check(o, blocks, 1)
  _KERNELS[ast.src] = (kind, o, blocks, tuple(order))


def registered_kernel(ast: UOp) -> tuple[str, int, int, tuple[str, ...]] | None:
  """(kind, O, blocks, pointer order) of a kernel AST registered with `register_kernel` (its KernelInfo aside)."""
  return _KERNELS.get(ast.src) if ast.op is Ops.SINK else None
