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
horizontal sum per row at the end. `ROWS` rows share each activation block load.
"""
from __future__ import annotations

from tiny_uop.dtype import dtypes
from tiny_uop.uop import AxisType, Ops, UOp

__all__ = ["Q8_0_BYTES", "vnni_form", "q8_0_matvec_ir", "q8_0_matvec_ast", "match_q8_0_matvec"]

Q8_0_BYTES = 34
"""Bytes of one Q8_0 block: a float16 scale and 32 int8 values (ggml-common.h `block_q8_0`)."""
ROWS = 4
"""Rows of the weight one K loop runs together (their 8-lane accumulators: 4 ymm registers)."""

# (target features, intrinsic): AVX512-VNNI's 256-bit form needs AVX512VL; AVX-VNNI (Alder Lake and later) is the
# VEX encoding of the same instruction, which LLVM selects from the same intrinsic under +avxvnni.
_FORMS = {"avx512_vnni": ("+avx512vnni,+avx512vl", "llvm.x86.avx512.vpdpbusd.256"),
          "avx_vnni": ("+avxvnni", "llvm.x86.avx512.vpdpbusd.256")}


def vnni_form(isa: frozenset[str] | set[str]) -> str | None:
  """Which VNNI form a machine with cpuinfo flags `isa` (`Machine.isa`) runs: "avx512_vnni" (with AVX512VL),
  "avx_vnni", or None (no int8 dot-product instruction: lower the plain int32 math instead)."""
  if "avx512_vnni" in isa and "avx512vl" in isa: return "avx512_vnni"
  return "avx_vnni" if "avx_vnni" in isa else None


def _check(o: int, nb: int, threads: int) -> None:
  for name, v in (("O", o), ("NB", nb), ("threads", threads)):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"q8_0_matvec_ir: {name} must be a positive int, got {v!r}")
  if o % threads: raise ValueError(f"q8_0_matvec_ir: O={o} rows must split evenly over threads={threads}")
  if o * nb * Q8_0_BYTES >= 2 ** 31:  # the byte offsets are i32
    raise ValueError(f"q8_0_matvec_ir: {o}x{nb} blocks are 2**31 bytes or more; valid: fewer")


def q8_0_matvec_ir(o: int, nb: int, threads: int = 1, name: str = "q8_0_matvec", form: str = "avx512_vnni") -> str:
  """The LLVM IR module of the Q8_0 matvec kernel described in the module docstring: O rows of NB blocks, split
  into `threads` row shares, with `form` one of `vnni_form`'s answers. ValueError for a bad shape or form. Only run
  what it compiles to on a CPU that has `form`.

  >>> "@llvm.x86.avx512.vpdpbusd.256(" in q8_0_matvec_ir(8, 2)
  True
  """
  _check(o, nb, threads)
  if form not in _FORMS: raise ValueError(f"q8_0_matvec_ir: form {form!r} is not one of {sorted(_FORMS)}")
  features, fn = _FORMS[form]
  per = o // threads
  rows = next(r for r in (ROWS, 2, 1) if per % r == 0)
  v8f, v8i, b = "<8 x float>", "<8 x i32>", Q8_0_BYTES
  ln = [f"declare {v8i} @{fn}({v8i}, {v8i}, {v8i})", "declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)",
        f"declare float @llvm.vector.reduce.fadd.v8f32(float, {v8f})",
        f"declare {v8f} @llvm.fma.v8f32({v8f}, {v8f}, {v8f})",
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
        "r.pre:", f"  %r0 = mul i32 %core_id, {per}", "  br label %r.head",
        "r.head:", "  %rg = phi i32 [0, %r.pre], [%rg.next, %k.exit]", f"  %r.ok = icmp slt i32 %rg, {per // rows}",
        "  br i1 %r.ok, label %k.pre, label %done",
        "k.pre:", f"  %rgo = mul i32 %rg, {rows}", "  %row = add i32 %r0, %rgo"]
  for r in range(rows):
    ln += [f"  %row{r} = add i32 %row, {r}", f"  %rb{r} = mul i32 %row{r}, {nb * b}"]
  ln += ["  br label %k.head", "k.head:", "  %kb = phi i32 [0, %k.pre], [%kb.next, %k.body]"]
  ln += [f"  %a{r} = phi {v8f} [zeroinitializer, %k.pre], [%a{r}.n, %k.body]" for r in range(rows)]
  ln += [f"  %k.ok = icmp slt i32 %kb, {nb}", "  br i1 %k.ok, label %k.body, label %k.exit",
         "k.body:", "  %xo = mul i32 %kb, 32", "  %xp = getelementptr inbounds i8, ptr %xq, i32 %xo",
         f"  %xv = load {v8i}, ptr %xp, align 1", "  %cp = getelementptr inbounds i32, ptr %corr, i32 %kb",
         "  %cs = load i32, ptr %cp, align 4", f"  %cv = insertelement {v8i} zeroinitializer, i32 %cs, i32 0",
         "  %dxp = getelementptr inbounds float, ptr %xd, i32 %kb", "  %dx = load float, ptr %dxp, align 4",
         f"  %bo = mul i32 %kb, {b}"]
  for r in range(rows):
    ln += [f"  %wo{r} = add i32 %rb{r}, %bo", f"  %wp{r} = getelementptr inbounds i8, ptr %raw, i32 %wo{r}",
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
