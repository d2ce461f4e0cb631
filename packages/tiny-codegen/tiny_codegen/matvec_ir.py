"""A float32 matvec kernel in LLVM IR that prefetches its weight rows (issue #39): `out[o] = sum_k w[o, k] * x[k]`
for a row-major weight W (O, K), the product an LLM's decode step runs for every float32 projection.

Why a kernel of its own: a decode step streams each weight once from L3 or memory (150 MB a token for the 4-layer
F32 bench model), and the lowered matvec (`r_1_1_2048`, x @ W.T with K contiguous) ran at the latency of its misses:
~15 GB/s on one core of the 2-core Xeon 6/207 and no faster with two threads (bench/README.md, "LLM: F32 decode
matvecs prefetch their rows"). The int8 decode kernels (`x86_vnni`) gained 2-3x from a software prefetch of the
next row group; the same here needs the prefetch inside the K loop, which the lowering has no op for.

The kernel, `void <name>(float *out, float *w, float *x, i32 core_id)`, one call per thread `core_id` of `threads`,
computes rows [core_id * O/threads, (core_id+1) * O/threads) in groups of `rows` rows sharing each vector of x:
per step of K, `unroll` vectors of each row (`unroll * rows` accumulators: the machine's FMA chains), the lines the
same step will read `ahead` bytes further on prefetched into L1 (`prefetch_ahead`: one way of the L1d); K's last
vectors (K % (unroll * lanes) of them) after the loop; one horizontal sum per row. K must be a multiple of the
vector's lanes (`fits`); elsewhere the product is lowered as usual.

`tiny_tensor.llm` registers the kernel AST of its one-row float32 projection (`register_kernel`), scheduled over
placeholders once per shape, and `tiny_codegen.program` hands an AST registered here to this kernel on the LLVM CPU
renderer (CHECK_OOB off).
"""
from __future__ import annotations

from tiny_uop.uop import Ops, UOp

__all__ = ["group_rows", "fits", "prefetch_ahead", "accumulators", "f32_matvec_ir", "register_kernel",
           "registered_kernel",
           "row_groups"]

ROWS = 1
"""Rows of W one K loop runs together, sharing each vector of x: one, so a thread reads its rows one after another as
one contiguous stream that the hardware prefetchers follow (the Q8_0/Q4_K kernels' `x86_vnni.ROWS` says why). Zen 4
(EPYC fam 25 model 17), 2048x768 one thread, 24 weights in turn (150 MB), thread CPU time a matvec: 4 rows 383-415
us (15-16 GB/s), 2 rows 422-446, 1 row 218-248 us (26-29 GB/s). The prefetch stays (`prefetch_ahead`, then 16 KB ahead
with one row on a 32 KB L1d, now one L1d way, 4 KB): in that loop of one shape it read no faster than none, but in the
12-layer F32 decode step (the bench LLM, one thread, thread CPU time, load 10) none took 21.0-23.2 ms against its
17.5-18.2."""


def row_groups(per: int, rows: int, stride: int, elem: str, base: str) -> list[str]:
  """The IR of a matvec kernel's row loop head (this one's and tiny_codegen.x86_vnni's): this thread's `per` rows from
  `core_id * per`, in groups of `rows` (block `%r.pre`, then `%r.head`, exiting to `%done`; the group's K loop
  returns through `%k.exit`), then in `%k.pre` each row's index `%row<r>`, the offset `%rb<r>` of its first element
  (`stride` elements of IR type `elem` a row) and its pointer `%rp<r>` from `base` (the K loop addresses from it:
  offsets from the base each paid a sign extension and an add per step)."""
  ln = ["r.pre:", f"  %r0 = mul i32 %core_id, {per}", "  br label %r.head",
        "r.head:", "  %rg = phi i32 [0, %r.pre], [%rg.next, %k.exit]", f"  %r.ok = icmp slt i32 %rg, {per // rows}",
        "  br i1 %r.ok, label %k.pre, label %done",
        "k.pre:", f"  %rgo = mul i32 %rg, {rows}", "  %row = add i32 %r0, %rgo"]
  for r in range(rows):
    ln += [f"  %row{r} = add i32 %row, {r}", f"  %rb{r} = mul i32 %row{r}, {stride}",
           f"  %rp{r} = getelementptr inbounds {elem}, ptr {base}, i32 %rb{r}"]
  return ln

def group_rows(per: int, rows: int = ROWS) -> int:
  """Rows a K loop runs together: `rows` (at least one), fewer where a thread's `per` rows don't divide by it."""
  return next(r for r in range(max(1, rows), 0, -1) if per % r == 0)


def fits(o: int, k: int, lanes: int) -> bool:
  """Whether the kernel takes an (O, K) float32 weight with `lanes` floats a vector: K a positive multiple of the
  lanes, O positive, W's element offsets under 2**31 (they are i32)."""
  return lanes > 0 and o > 0 and k > 0 and k % lanes == 0 and o * k < 2 ** 31


def accumulators(fma_chains: int, registers: int, rows: int) -> int:
  """Vectors of each row a K step loads (`unroll`): enough accumulators (rows x unroll) for `fma_chains` chains,
  within half the vector registers, at least one. `tiny_codegen.program` asks for `machine.FMA_LATENCY` chains (one
  FMA unit's), not `machine.fma_chains` (both units'): the weights stream in, one vector an FMA, and no cache level
  feeds a core more than a line (one 64-byte vector) a cycle, so the FMA latency's worth of chains never waits on
  an FMA. Zen 4 (EPYC fam 25 model 17), the 12-layer F32 bench decode step (351 MB a token), one thread, thread CPU
  time tokens/s, a process each in turns (5 x 32 tokens, best/median, load 7-8, three turns): 8 accumulators (both
  units' chains: 512 bytes a K step, the rule before) 57.1/55.2, 59.7/58.2, 60.8/57.6; 4 accumulators
  62.7/59.8, 61.1/60.6, 67.6/67.0; 2 accumulators 69.4/68.1, 63.0/60.3, 64.2/63.7."""
  return max(1, min(-(-fma_chains // rows), max(1, registers // 2 // rows)))


def prefetch_ahead(l1d: int, ways: int, line: int, step_bytes: int) -> int:
  """Bytes ahead of each row's loads the kernel prefetches into L1: the span of one way of the L1d (`l1d` bytes,
  `ways` ways: 4 KB on Zen 4's 32 KB x 8 and on Sapphire Rapids' 48 KB x 12), so a row's lines prefetched and not
  yet read fall one in each set and take at most one way of it, the other ways left to x and the lines in use.
  Whole lines, at least one K step (`step_bytes`). Zen 4 (EPYC fam 25 model 17), the 12-layer F32 bench decode step,
  one thread, thread CPU time in turns (load 9-11): none 23.7-25.1 ms, 2 KB 15.2-16.7, 4 KB 15.5-16.1, 8 KB
  17.2-18.9, 16 KB (half the L1d, the rule before) 17.8-18.4. Before, with 4 rows a loop on the Xeon 6/207 (48 KB
  L1d), 2048x768 one thread, us a matvec: none 703/380, 3 KB a row 725/385, 6 KB 476/336, 12 KB 548/359."""
  return max(l1d // max(1, ways) // line * line, step_bytes)


def _check(o: int, k: int, threads: int, lanes: int) -> None:
  for name, v in (("O", o), ("K", k), ("threads", threads), ("lanes", lanes)):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"f32_matvec_ir: {name} must be a positive int, got {v!r}")
  if o % threads: raise ValueError(f"f32_matvec_ir: O={o} rows must split evenly over threads={threads}")
  if not fits(o, k, lanes):
    raise ValueError(f"f32_matvec_ir: an {o}x{k} weight with {lanes}-float vectors; valid: K a multiple of the lanes "
                     "and O*K under 2**31")


def f32_matvec_ir(o: int, k: int, threads: int = 1, name: str = "f32_matvec", lanes: int = 16, unroll: int = 2,
                  ahead: int = 6144, line: int = 64, order: tuple[str, ...] = ("out", "w", "x"),
                  rows: int = ROWS) -> str:
  """The LLVM IR module of the float32 matvec kernel in the module docstring: O rows of K floats split into
  `threads` row shares, `rows` rows a K loop (fewer where a share doesn't divide: `group_rows`), `lanes` floats a
  vector, `unroll` vectors of each row a K step, prefetching `ahead` bytes
  past each row's loads (`line`-byte lines; 0: no prefetch); the pointer arguments in `order` (then i32 core_id).
  ValueError for a bad shape.

  >>> "@llvm.prefetch.p0(" in f32_matvec_ir(8, 32)
  True
  """
  _check(o, k, threads, lanes)
  if not isinstance(unroll, int) or unroll <= 0:
    raise ValueError(f"f32_matvec_ir: unroll must be positive, got {unroll}")
  if ahead < 0 or line <= 0: raise ValueError(f"f32_matvec_ir: ahead={ahead}, line={line}; valid: ahead >= 0, line > 0")
  if sorted(order) != ["out", "w", "x"]: raise ValueError(f"f32_matvec_ir: order {order!r} must name out, w, x once")
  per = o // threads
  rows = group_rows(per, rows)
  vec, step = f"<{lanes} x float>", unroll * lanes
  kmain, tail = k // step * step, (k % step) // lanes
  lines = -(-step * 4 // line) if ahead else 0
  ln = [f"declare float @llvm.vector.reduce.fadd.v{lanes}f32(float, {vec})",
        f"declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})",
        "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
        f"define void @{name}({', '.join(f'ptr noalias %{a}' for a in order)}, i32 %core_id) #0 {{",
        "entry:", "  br label %r.pre", *row_groups(per, rows, k, "float", "%w")]
  ln += ["  br label %k.head", "k.head:", "  %kb = phi i32 [0, %k.pre], [%kb.next, %k.body]"]
  ln += [f"  %a{r}_{u} = phi {vec} [zeroinitializer, %k.pre], [%a{r}_{u}.n, %k.body]"
         for r in range(rows) for u in range(unroll)]
  ln += [f"  %k.ok = icmp slt i32 %kb, {kmain}", "  br i1 %k.ok, label %k.body, label %k.exit", "k.body:"]
  for u in range(unroll):
    ln += [f"  %xo{u} = add i32 %kb, {u * lanes}", f"  %xp{u} = getelementptr inbounds float, ptr %x, i32 %xo{u}",
           f"  %xv{u} = load {vec}, ptr %xp{u}, align 4"]
  for r in range(rows):
    ln.append(f"  %wb{r} = getelementptr inbounds float, ptr %rp{r}, i32 %kb")
    for i in range(lines):  # no `inbounds`: past W's end the address is never read (a prefetch doesn't fault)
      ln += [f"  %pf{r}_{i} = getelementptr i8, ptr %wb{r}, i64 {ahead + line * i}",
             f"  call void @llvm.prefetch.p0(ptr %pf{r}_{i}, i32 0, i32 3, i32 1)"]
    for u in range(unroll):
      ln += [f"  %wp{r}_{u} = getelementptr inbounds float, ptr %wb{r}, i32 {u * lanes}",
             f"  %wv{r}_{u} = load {vec}, ptr %wp{r}_{u}, align 4",
             f"  %a{r}_{u}.n = call {vec} @llvm.fma.v{lanes}f32({vec} %wv{r}_{u}, {vec} %xv{u}, {vec} %a{r}_{u})"]
  ln += [f"  %kb.next = add i32 %kb, {step}", "  br label %k.head", "k.exit:"]
  for t in range(tail):  # K's last vectors: fewer than a step
    ln += [f"  %tp{t} = getelementptr inbounds float, ptr %x, i32 {kmain + t * lanes}",
           f"  %tx{t} = load {vec}, ptr %tp{t}, align 4"]
  for r in range(rows):
    acc = [f"%a{r}_{u}" for u in range(unroll)]
    for t in range(tail):
      ln += [f"  %tw{r}_{t} = getelementptr inbounds float, ptr %rp{r}, i32 {kmain + t * lanes}",
             f"  %tv{r}_{t} = load {vec}, ptr %tw{r}_{t}, align 4",
             f"  %ta{r}_{t} = call {vec} @llvm.fma.v{lanes}f32({vec} %tv{r}_{t}, {vec} %tx{t}, {vec} {acc[t]})"]
      acc[t] = f"%ta{r}_{t}"
    s = acc[0]
    for u in range(1, unroll):
      ln.append(f"  %s{r}_{u} = fadd {vec} {s}, {acc[u]}")
      s = f"%s{r}_{u}"
    ln += [f"  %h{r} = call reassoc float @llvm.vector.reduce.fadd.v{lanes}f32(float -0.0, {vec} {s})",
           f"  %op{r} = getelementptr inbounds float, ptr %out, i32 %row{r}",
           f"  store float %h{r}, ptr %op{r}, align 4"]
  ln += ["  %rg.next = add i32 %rg, 1", "  br label %r.head", "done:", "  ret void", "}",
         "attributes #0 = { nounwind }"]
  return "\n".join(ln) + "\n"


# kernel AST sources -> (O, K, pointer order), registered by the Tensor code that builds the graph (`tiny_tensor.llm`
# schedules its one-row projection over placeholders once per shape): the match is the interned AST itself, exact
_KERNELS: dict[tuple[UOp, ...], tuple[int, int, tuple[str, ...]]] = {}


def register_kernel(ast: UOp, o: int, k: int, order: tuple[str, ...]) -> None:
  """Record that kernel AST `ast` (a SINK) computes the (O, K) float32 matvec with its PARAMs in `order` (a
  permutation of "out", "w", "x"), so `tiny_codegen.program` runs `f32_matvec_ir`'s kernel for it. ValueError for a
  non-SINK, a bad order or a shape no vector width takes."""
  if ast.op is not Ops.SINK: raise ValueError(f"register_kernel needs a kernel AST (SINK), got {ast.op}")
  if sorted(order) != ["out", "w", "x"]: raise ValueError(f"register_kernel: order {order!r} must name out, w, x once")
  if not fits(o, k, 1): raise ValueError(f"register_kernel: an {o}x{k} weight; valid: O, K positive, O*K < 2**31")
  _KERNELS[ast.src] = (o, k, tuple(order))


def registered_kernel(ast: UOp) -> tuple[int, int, tuple[str, ...]] | None:
  """(O, K, pointer order) of a kernel AST registered with `register_kernel` (its KernelInfo aside), else None."""
  return _KERNELS.get(ast.src) if ast.op is Ops.SINK else None
