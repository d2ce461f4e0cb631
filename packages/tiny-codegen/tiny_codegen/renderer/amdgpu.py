"""AMDGPU renderer (`AMDGPURenderer`): linear UOps -> LLVM IR for `amdgcn-amd-amdhsa` (arch e.g. gfx1100), compiled
by llvmlite's AMDGPU backend and linked into an HSA code object (`compiler/amdgpu.py`).

The kernel is `define amdgpu_kernel void @name(ptr addrspace(1) noalias %data0, ..., i32 %var.<name>, ...)`:
buffers by PARAM slot then DEFINE_VARs in name order, all in the kernarg segment (8-byte pointers, 4-byte ints,
naturally aligned). `SPECIAL` gidx{i} is `llvm.amdgcn.workgroup.id.{x,y,z}`, lidx{i} `llvm.amdgcn.workitem.id.*`
(read once in the entry block); launch `spec.global_size` work-groups of `spec.local_size` work-items.
DEFINE_LOCAL is an LDS array (`addrspace(3)` global), BARRIER a workgroup fence + `llvm.amdgcn.s.barrier`,
accumulators are private `alloca`s (`addrspace(5)`, promoted to VGPRs by the optimizer). Loops, casts and ALU ops
are the host LLVM renderer's (`llvmir.py`). Transcendentals: `llvm.exp2/log2/sqrt` (hardware, correctly handled
denormals) for half/float; SIN and every double EXP2/LOG2 use tiny's polynomials. bfloat16 goes through float32.
Tensor cores, declared in `tensor_cores` (fragment layouts in `opt/kernel.py` `TC_FRAGMENTS`): RDNA3 (gfx11xx)
`llvm.amdgcn.wmma.f32.16x16x16.{f16,bf16}` (wave32, `_frag_wmma_rdna3`); CDNA2/3 (gfx90a, gfx94x, gfx950) MFMA
`llvm.amdgcn.mfma.f32.16x16x16f16` / `.16x16x16bf16.1k` (wave64, one 16x16 block: v_mfma_f32_16x16x16_{f16,bf16},
`_frag_mfma_16x16`). A WMMA UOp renders to one call, taking the accumulator as its C operand (`gpu_math_matcher`);
a vector CONST (the accumulator's zero) becomes a VECTORIZE. gfx9 code objects are wave64 (the kernel descriptor's
ENABLE_WAVEFRONT_SIZE32 is 0); `warp_size` 64 makes the optimizer size work-groups in whole waves.
"""
from __future__ import annotations

from tiny_uop.device import Renderer, TensorCore
from tiny_uop.dtype import AddrSpace, DType, PtrDType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import Ops, UOp

from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, amdgpu_datalayout
from tiny_codegen.renderer import kernel_params, var_ident
from tiny_codegen.renderer.llvmir import _LLVMEmitter, ltype
from tiny_codegen.renderer.ptx import gpu_math_matcher

MFMA_ARCHS = ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")  # CDNA2/3: v_mfma_f32_16x16x16_{f16,bf16} (bf16_1k)
CODE_OBJECT_VERSION = 400  # HSA code object v4: loaded by every ROCm, and linkable by ld.lld 14 (v5+ needs lld 16+)
_AS = {AddrSpace.GLOBAL: 1, AddrSpace.LOCAL: 3, AddrSpace.REG: 5}


def _ptr(dt: DType, spaces: dict[AddrSpace, int] = _AS) -> str:
  space = spaces[dt.addrspace] if isinstance(dt, PtrDType) else 1
  return f"ptr addrspace({space})"


# ops whose result's low 24 bits depend only on their operands' low 24 bits (WHERE: on its two values; CAST: an
# integer one, widening or truncating): LLVM's demanded-bits analysis looks through them to a mask below
_LOW_BITS_OPS = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MULACC, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.WHERE, Ops.CAST)


def _const(x: UOp) -> int | None: return int(x.arg) if x.op is Ops.CONST else None


def _is_24_bit_mask(x: UOp) -> bool:
  """`x & c` with c below 2**24 but bit 23 set (0xFFFFFF, 0xFFFF00, ...), or a `% 2**24`, `// 2**24` or `>> 24`: the
  last three as parts of `x % 2**24` in any of its lowered forms (`x - (x // 2**24) * 2**24`, floor mod's
  `x + floordiv(x, 2**24) * -2**24`, `x - ((x >> 24) << 24)`), which LLVM turns into `x & 0xFFFFFF` (a lone division
  or shift is guarded too: harmless). A mask that clears bit 23 (0x3FFFFF) changes a bit the 24-bit multiply reads,
  so LLVM keeps it (measured): no guard."""
  c = _const(x.src[-1]) if x.src else None
  if x.op is Ops.AND: return any(c is not None and c >> 23 == 1 for c in map(_const, x.src))
  if x.op in (Ops.CMOD, Ops.CDIV): return c == 1 << 24
  return x.op is Ops.SHR and c == 24


def _has_24_bit_mask(x: UOp, limit: int = 64) -> bool:
  """Whether a 24-bit mask (`_is_24_bit_mask`) feeds `x` through ops that keep low bits low (`_LOW_BITS_OPS`): then
  LLVM's AMDGPU backend may know `x` fits 24 bits only because of that mask and remove it under a 24-bit multiply
  (see `_AMDGPUEmitter.alu`). Walks at most `limit` nodes (explicit stack): a mask further up is not found."""
  stack, seen = [x], set[UOp]()
  while stack and len(seen) < limit:
    u = stack.pop()
    if u in seen or not dtypes.is_int(u.dtype): continue
    seen.add(u)
    if _is_24_bit_mask(u): return True
    if u.op in _LOW_BITS_OPS: stack.extend(u.src)  # a CAST from a float, a WHERE's condition: not int, skipped
  return False


def _vec_const(c: UOp) -> UOp | None:
  """A vector CONST (the identity of a vector accumulator: the TC opt's REDUCE of WMMA results) as a VECTORIZE of its
  scalar, which the LLVM emitter renders."""
  if c.dtype.count == 1: return None
  return UOp(Ops.VECTORIZE, c.dtype, (UOp.const(c.dtype.scalar(), c.arg),) * c.dtype.count)


class AMDGPURenderer(Renderer):
  """LLVM IR for AMD GPUs (arch `gfxNNNN`, default gfx1100); see the module docstring."""
  device = "AMD"
  has_local = True
  has_shared = True
  supports_float4 = True
  global_max = (0x7FFFFFFF, 65535, 65535)
  local_max = (1024, 1024, 1024)
  shared_max = 65536
  buffer_align = 16  # buffer arguments are declared `align 16`: the TC opt may read fragments with vector loads
  bf16_through_float = True
  decompose_ops = (Ops.SIN,)
  transcendental_via_f64 = False
  exact_fmod = False  # LLVM's AMDGPU `frem` expansion differs between versions (older ones: x - trunc(x/y)*y)
  extra_matcher = gpu_math_matcher + PatternMatcher([(UPat(Ops.CONST, name="c"), _vec_const)])
  compiler_cls = AMDGPUCompiler

  def __init__(self, arch: str = ""):
    arch = arch or "gfx1100"
    if not arch.startswith("gfx"):
      raise ValueError(f"AMDGPU arch {arch!r} is not a gfx name; valid e.g. gfx1100, gfx90a")
    self.tensor_cores = [TensorCore((16, 16, 16), dt, dtypes.float32, 32, (16, 16, 8), ("wmma.16x16x16",))
                         for dt in (dtypes.float16, dtypes.bfloat16)] if arch.startswith("gfx11") else \
      [TensorCore((16, 16, 16), dt, dtypes.float32, 64, (4, 4, 4), ("mfma.16x16x16",))
       for dt in (dtypes.float16, dtypes.bfloat16)] if arch in MFMA_ARCHS else []
    self.warp_size = 64 if arch.startswith("gfx9") else 32  # CDNA (gfx9xx) runs wave64, RDNA wave32
    super().__init__(arch)

  def make_compiler(self) -> AMDGPUCompiler: return AMDGPUCompiler(self.arch or "gfx1100")

  def supported_dtypes(self) -> tuple[DType, ...]:
    return tuple(d for d in dtypes.all if d not in (dtypes.bfloat16, *dtypes.fp8s))

  def render(self, uops: list[UOp]) -> str:
    """LLVM IR (module with triple and data layout) of the kernel `uops`."""
    return _AMDGPUEmitter(uops, self.arch or "gfx1100").render()


class _AMDGPUEmitter(_LLVMEmitter):
  """LLVM IR for a GPU target; subclasses (NVPTX) override the target hooks: address spaces, `special`, `barrier`,
  `module`."""
  spaces = _AS
  target = "AMDGPU"

  def __init__(self, uops: list[UOp], arch: str):
    super().__init__(uops)
    self.arch = arch
    self.globals: list[str] = []

  def ptr_ty(self, dt: DType) -> str: return _ptr(dt, self.spaces)

  def alu(self, u: UOp) -> str:
    """The host renderer's ALU op, except a 64-bit integer multiply of a value masked to 24 bits (MUL, or MULACC's
    multiply; `_has_24_bit_mask` finds the mask), whose product goes through `mul24_guard` before anything adds to it.

    Why: LLVM 22.1's AMDGPU backend (llvmlite 0.50; gfx1100 and gfx942) turns `mul i64 (and a, 0xFFFFFF), (and b,
    0xFFFFFF)` into a 24-bit multiply (v_mul_u32_u24 / v_mul_hi_u32_u24, which mask their sources themselves), drops
    the `and`s as redundant for it, then folds the multiply with a following `add` into v_mad_u64_u32, a full 32x32
    multiply: bits 24-31 of a and b leak into the product (`(a & 0xFFFFFF) * (b & 0xFFFFFF) + a` computes
    `lo32(a) * lo32(b) + a`; the same with one mask and a constant below 2**24 as the other factor; fixed upstream by
    llvm-project#198729). `llvm.amdgcn.softwqm`, an identity in a compute kernel (no whole-quad mode to keep),
    hides the product from the fold, so the multiply stays the 24-bit pair (right, as masked) and the add a 64-bit
    add, what LLVM's fix emits (the guard itself is no instruction). `freeze` does not (the DAG pushes it back
    through a multiply by a constant and through the `and`), nor does an inline asm (llvmlite has no AMDGPU asm
    parser to emit it). Reproduction: tiny-runtime-amd's README, Known issues; its `tests/test_amd_mul24.py`."""
    if self.target != "AMDGPU" or u.op not in (Ops.MUL, Ops.MULACC) or not dtypes.is_int(u.dtype) or \
       u.dtype.scalar().itemsize != 8 or not any(_has_24_bit_mask(s) for s in u.src[:2]):
      return super().alu(u)
    t = ltype(u.dtype)
    prod = self.mul24_guard(self.op(f"mul {t} {self.val(u.src[0])}, {self.val(u.src[1])}"), t)
    return prod if u.op is Ops.MUL else self.op(f"add {t} {prod}, {self.val(u.src[2])}")

  def mul24_guard(self, x: str, t: str) -> str:
    """`x` through `llvm.amdgcn.softwqm` (soft whole-quad mode: a copy, since a compute kernel never needs WQM): a
    value whose bits LLVM's DAG does not look through, so no combine folds across it."""
    fn = "llvm.amdgcn.softwqm." + ("i64" if t == "i64" else f"v{t[1:t.index(' ')]}i64")
    self.decls.add(f"declare {t} @{fn}({t})")
    return self.op(f"call {t} @{fn}({t} {x})")

  def special(self, axis: str) -> str:
    """The intrinsic reading gidx{i} (work-group id) or lidx{i} (work-item id)."""
    return f"llvm.amdgcn.{'workgroup' if axis[0] == 'g' else 'workitem'}.id.{'xyz'[int(axis[4:])]}"

  def barrier(self) -> None:
    self.decls.add("declare void @llvm.amdgcn.s.barrier()")
    self.emit('fence syncscope("workgroup") release')
    self.emit("call void @llvm.amdgcn.s.barrier()")
    self.emit('fence syncscope("workgroup") acquire')

  def module(self, name: str, args: list[str]) -> str:
    attrs = f'"amdgpu-flat-work-group-size"="1,1024" "target-cpu"="{self.arch}"'
    head = [f'target datalayout = "{amdgpu_datalayout(self.arch)}"', 'target triple = "amdgcn-amd-amdhsa"', ""]
    return "\n".join(head + self.globals + sorted(self.decls)) + (
      f"\ndefine amdgpu_kernel void @{name}({', '.join(args)}) #0 {{\nentry:\n" +
      "".join(a + "\n" for a in self.allocas) + "\n".join(self.lines) +
      f"\n  ret void\n}}\nattributes #0 = {{ {attrs} }}\n"
      f'!llvm.module.flags = !{{!0}}\n!0 = !{{i32 1, !"amdhsa_code_object_version", i32 {CODE_OBJECT_VERSION}}}\n')

  def wmma(self, u: UOp) -> str:
    if self.arch.startswith("gfx9"): return self.mfma(u)
    a, b, c = u.src
    if (a.dtype.count, b.dtype.count, c.dtype.count) != (16, 16, 8) or u.dtype.scalar() != dtypes.float32:
      raise ValueError(f"AMDGPU WMMA needs 16-wide A/B and 8-wide float C (wave32 16x16x16), got "
                       f"{a.dtype}/{b.dtype}/{c.dtype}")
    kind = {dtypes.float16: "f16", dtypes.uint16: "bf16"}.get(a.dtype.scalar())  # bf16 arrives as its uint16 bits
    if kind is None:
      raise NotImplementedError(f"AMDGPU WMMA has no {a.dtype.scalar()} inputs; valid: half, uint16 (bf16)")
    tin = "<16 x half>" if kind == "f16" else "<16 x i16>"
    fn = f"llvm.amdgcn.wmma.f32.16x16x16.{kind}"
    self.decls.add(f"declare <8 x float> @{fn}({tin}, {tin}, <8 x float>)")
    args = []
    for s in (a, b): args.append(f"{tin} {self.val(s)}")
    out = self.tmp()
    self.emit(f"{out} = call <8 x float> @{fn}({', '.join(args)}, <8 x float> {self.val(c)})")
    return out

  def mfma(self, u: UOp) -> str:
    """WMMA on CDNA: one `v_mfma_f32_16x16x16_{f16,bf16}` (4 A and 4 B elements and 4 float accumulators per lane of
    the wave64; cbsz/abid/blgp 0: no broadcast or lane swizzle)."""
    a, b, c = u.src
    if (a.dtype.count, b.dtype.count, c.dtype.count) != (4, 4, 4) or u.dtype.scalar() != dtypes.float32:
      raise ValueError(f"AMDGPU MFMA needs 4-wide A/B and 4-wide float C (wave64 16x16x16), got "
                       f"{a.dtype}/{b.dtype}/{c.dtype}")
    kind = {dtypes.float16: "16x16x16f16", dtypes.uint16: "16x16x16bf16.1k"}.get(a.dtype.scalar())
    if kind is None:
      raise NotImplementedError(f"AMDGPU MFMA has no {a.dtype.scalar()} inputs; valid: half, uint16 (bf16)")
    tin = "<4 x half>" if kind == "16x16x16f16" else "<4 x i16>"
    fn = f"llvm.amdgcn.mfma.f32.{kind}"
    self.decls.add(f"declare <4 x float> @{fn}({tin}, {tin}, <4 x float>, i32 immarg, i32 immarg, i32 immarg)")
    out = self.tmp()
    self.emit(f"{out} = call <4 x float> @{fn}({tin} {self.val(a)}, {tin} {self.val(b)}, <4 x float> {self.val(c)}, "
              "i32 0, i32 0, i32 0)")
    return out

  def render(self) -> str:
    uops = self.uops
    name = getattr(uops[-1].arg, "name", "kernel")
    params, dvars = kernel_params(uops)
    args = [f"ptr addrspace(1) noalias align 16 %data{p.arg}" for p in params]
    seen: set[str] = set()
    for dv in dvars:
      if dv.arg[0] not in seen: args.append(f"i32 %var.{var_ident(dv.arg[0])}")
      seen.add(dv.arg[0])
    for u in uops:
      op, dt, src = u.op, u.dtype, u.src
      if op is Ops.PARAM: self.r[u] = f"%data{u.arg}"
      elif op is Ops.DEFINE_VAR: self.r[u] = f"%var.{var_ident(u.arg[0])}"
      elif op is Ops.SPECIAL:
        if u.arg[:4] not in ("gidx", "lidx"):
          raise NotImplementedError(f"{self.target} renderer has no index {u.arg!r}")
        fn = self.special(u.arg)
        self.decls.add(f"declare i32 @{fn}()")
        self.r[u] = f"%{u.arg}"
        self.allocas.append(f"  %{u.arg} = call i32 @{fn}()")
      elif op in (Ops.CONST, Ops.VCONST): pass
      elif op is Ops.DEFINE_REG:
        assert isinstance(dt, PtrDType)
        self.r[u] = f"%acc{u.arg}"
        space = self.spaces[AddrSpace.REG]
        self.allocas.append(f"  %acc{u.arg} = alloca [{dt.size} x {ltype(dt.base, mem=True)}], align 16" +
                            (f", addrspace({space})" if space else ""))
      elif op is Ops.DEFINE_LOCAL:
        assert isinstance(dt, PtrDType)
        sym = f"@{name}.temp{len(self.globals)}"
        self.globals.append(f"{sym} = internal addrspace(3) global [{dt.size} x {ltype(dt.base, mem=True)}] "
                            "undef, align 16")
        self.r[u] = sym
      elif op in (Ops.RANGE, Ops.END): self.loop_or_memory_op(u)
      elif op is Ops.IF:
        k = self.n = self.n + 1
        self.r[u] = f"if{k}"
        self.emit(f"br i1 {self.val(src[0])}, label %if{k}.then, label %if{k}.end")
        self.lines.append(f"if{k}.then:")
      elif op is Ops.ENDIF:
        self.emit(f"br label %{self.r[src[0]]}.end")
        self.lines.append(f"{self.r[src[0]]}.end:")
      elif op is Ops.BARRIER: self.barrier()
      elif op in (Ops.INDEX, Ops.LOAD): self.loop_or_memory_op(u)
      elif op is Ops.STORE:
        v, vdt = self.val(src[1]), src[1].dtype
        if vdt.scalar() == dtypes.bool:
          z = self.tmp()
          self.emit(f"{z} = zext {ltype(vdt)} {v} to {ltype(vdt, mem=True)}")
          v = z
        st = f"store {ltype(vdt, mem=True)} {v}, {_ptr(src[0].dtype, self.spaces)} {self.val(src[0])}"
        if src[0] in self.gates:
          k = self.n = self.n + 1
          self.emit(f"br i1 {self.gates[src[0]]}, label %st{k}.do, label %st{k}.skip")
          self.lines.append(f"st{k}.do:")
          self.emit(st)
          self.emit(f"br label %st{k}.skip")
          self.lines.append(f"st{k}.skip:")
        else: self.emit(st)
      elif op is Ops.WMMA: self.r[u] = self.wmma(u)
      elif not self.value_op(u): raise NotImplementedError(f"{self.target} renderer can't render {op} ({dt})")
    return self.module(name, args)
