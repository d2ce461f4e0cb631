"""Whole models compiled for GPU targets on the NULL device (`NULL:PTX:sm_90`, `NULL:AMDGPU:gfx1100`, `NULL:OPENCL`):
a small convnet forward + backward, a transformer block, and half/bf16 matmuls. Nothing runs; every kernel is rendered
and compiled, and the outputs are checked with independent tools: ptxas cubins, pyelftools and msgpack on the AMD
code objects (ELF shared objects with the kernel descriptors and metadata), clang's OpenCL front end and PoCL's
compiler.
"""
from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import pytest

tiny_tensor = pytest.importorskip("tiny_tensor")
from tiny_tensor import Tensor, dtypes, engine, nn  # noqa: E402
from tiny_uop import Context  # noqa: E402

from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, find_ld_lld, parse_elf, read_metadata  # noqa: E402
from tiny_codegen.compiler.opencl import find_clang  # noqa: E402
from tiny_codegen.compiler.ptx import find_ptxas  # noqa: E402
from tiny_codegen.lower.gather import fold_onehot_reduces  # noqa: E402

TARGETS = {"PTX": "NULL:PTX:sm_90", "AMDGPU": "NULL:AMDGPU:gfx1100", "OPENCL": "NULL:OPENCL"}


def convnet(dev: str) -> list[Tensor]:
  """A 2-conv net's loss and its gradients (forward + backward)."""
  c1, c2, lin = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 16, 3), nn.Linear(16, 10)
  params = [c1.weight, c1.bias, c2.weight, c2.bias, lin.weight, lin.bias]
  for p in params:
    p.to_(dev)
    p.requires_grad = True
  x = Tensor.rand(4, 3, 12, 12, device=dev)
  h = c2(c1(x).relu().max_pool2d()).relu().max_pool2d()
  loss = lin(h.flatten(1)).log_softmax().mean()
  loss.backward()
  return [loss, *[p.grad for p in params]]


def transformer_block(dev: str) -> list[Tensor]:
  """Pre-norm causal self-attention + GELU MLP: (B, T, D) = (2, 8, 32), 4 heads."""
  B, T, D, H = 2, 8, 32, 4
  ln1, ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
  q, k, v, o = (nn.Linear(D, D) for _ in range(4))
  f1, f2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
  for m in (ln1, ln2, q, k, v, o, f1, f2):
    for p in (m.weight, m.bias): p.to_(dev)
  x = Tensor.rand(B, T, D, device=dev)
  h = ln1(x)

  def heads(t: Tensor) -> Tensor: return t.reshape(B, T, H, D // H).transpose(1, 2)  # (B, H, T, D/H)
  att = heads(q(h)).scaled_dot_product_attention(heads(k(h)), heads(v(h)), is_causal=True)
  x = x + o(att.transpose(1, 2).reshape(B, T, D))
  return [x + f2(f1(ln2(x)).gelu())]


def low_precision(dev: str) -> list[Tensor]:
  """half and bfloat16 matmuls with a softmax (float accumulation happens in the renderer's types)."""
  outs = []
  for dt in (dtypes.half, dtypes.bfloat16):
    a, b = Tensor.rand(16, 32, device=dev).cast(dt), Tensor.rand(32, 16, device=dev).cast(dt)
    outs.append((a @ b).softmax(-1))
  return outs


MODELS = {"convnet": convnet, "transformer": transformer_block, "low_precision": low_precision}
_compiled: dict[tuple[str, str], list[Any]] = {}
_asts: dict[tuple[str, str], list[Any]] = {}


def compiled(target: str, model: str) -> list[Any]:
  """ProgramSpecs of every kernel realizing `model` on the NULL device for `target` (realized once per session): the
  kernels the engine launched, whether this test compiled them or an earlier one in the process did (a set of new
  compile-cache entries missed the kernels other tests had compiled first, e.g. a loss's mean: order-dependent)."""
  if (target, model) not in _compiled:
    calls: list[Any] = []
    with Context(DEV=TARGETS[target]), engine.capture(calls.append):  # the NULL device's renderer follows DEV
      Tensor.realize(*MODELS[model]("NULL"))
    specs = list({id(c.spec): c.spec for c in calls if c.kind == "kernel"}.values())
    ast_of = {id(spec): key[0] for key, (spec, _) in engine._program_cache.items()}  # test-only peek: the cache
    _compiled[(target, model)] = specs
    _asts[(target, model)] = [ast_of[id(spec)] for spec in specs]
  return _compiled[(target, model)]


def _model_params(target: str, reason: str | None) -> list[Any]:
  return [pytest.param(m, marks=pytest.mark.skipif(reason is not None, reason=reason or "")) for m in MODELS]


@pytest.mark.parametrize("model", list(MODELS))
def test_kernel_counts_agree_across_targets(model):
  counts = {t: len(compiled(t, model)) for t in TARGETS}
  assert len(set(counts.values())) == 1, counts  # the schedule doesn't depend on the renderer
  assert counts["PTX"] >= {"convnet": 20, "transformer": 15, "low_precision": 4}[model], counts


# ***** shared memory: the GPU heuristic groups the models' reductions *****
SHARED_MARK = {"PTX": re.compile(r"\.shared \.align \d+ \.b8 \w+\[\d+\];"),
               "AMDGPU": re.compile(r"addrspace\(3\) global \["), "OPENCL": re.compile(r"__local \w+ \w+\[\d+\];")}
BARRIER_MARK = {"PTX": "bar.sync", "AMDGPU": "@llvm.amdgcn.s.barrier", "OPENCL": "barrier(CLK_LOCAL_MEM_FENCE)"}


def grouped_kernels(target: str, model: str) -> set[str]:
  """Names of the model's kernels the GPU heuristic gives a GROUPTOP (a workgroup reduction) for `target`."""
  from tiny_uop.plugins import load_renderer

  from tiny_codegen.opt import Kernel, OptOps, hand_coded_optimizations
  specs = compiled(target, model)
  ren = load_renderer(target)(*(["sm_90"] if target == "PTX" else ["gfx1100"] if target == "AMDGPU" else []))
  out = set()
  for ast, spec in zip(_asts[(target, model)], specs):
    opts = hand_coded_optimizations(Kernel(fold_onehot_reduces(ast), ren)).applied_opts  # as lower() does
    if any(o.op is OptOps.GROUPTOP for o in opts): out.add(spec.name)
  return out


@pytest.mark.parametrize("model", ["convnet", "transformer"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_model_reductions_use_shared_memory(target, model):
  """Reductions with few outputs and a long reduce (a conv's weight and bias gradients, the loss, layernorm
  statistics, the small matmuls) become workgroup reductions: shared memory + a barrier in exactly those kernels."""
  specs = compiled(target, model)
  grouped = grouped_kernels(target, model)
  with_shared = {s.name for s in specs if SHARED_MARK[target].search(s.src)}
  assert with_shared == grouped
  assert all(BARRIER_MARK[target] in s.src for s in specs if s.name in grouped)
  # convnet: conv1/conv2 weight gradients (4 output axes), conv2 forward, bias gradients, the loss's mean;
  # transformer: both layernorms' statistics and every Linear (<= 2048 outputs)
  names = {"convnet": {"r_8_3_3_3", "r_16_8_3_3", "r_8", "r_16", "r_"}, "transformer": {"r_2_8_1", "r_2_8_32"}}[model]
  assert names <= grouped, sorted(grouped)
  assert len(grouped) >= {"convnet": 6, "transformer": 6}[model], sorted(grouped)


def test_model_grouping_is_the_same_on_every_target():
  for model in ("convnet", "transformer"):
    assert grouped_kernels("PTX", model) == grouped_kernels("AMDGPU", model) == grouped_kernels("OPENCL", model)


# ***** PTX: ptxas assembled every kernel *****
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (NVIDIA CUDA toolkit)")
@pytest.mark.parametrize("model", list(MODELS))
def test_ptx_kernels_assemble(model):
  for spec in compiled("PTX", model):
    assert ".target sm_90" in spec.src and f".visible .entry {spec.name}(" in spec.src
    assert spec.lib[:4] == b"\x7fELF" and struct.unpack_from("<H", spec.lib, 18)[0] == 190  # EM_CUDA cubin


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (NVIDIA CUDA toolkit)")
@pytest.mark.parametrize("model", list(MODELS))
def test_nvptx_second_path_assembles_the_same_kernels(model):
  # the same kernel ASTs through LLVM's NVPTX backend: ptxas accepts them, with PTXRenderer's kernel signatures
  from tiny_codegen import get_program
  from tiny_codegen.renderer.nvptx import NVPTXRenderer
  r = NVPTXRenderer("sm_90")
  compiled("PTX", model)
  for ast, ref in zip(_asts[("PTX", model)], _compiled[("PTX", model)]):
    spec = get_program(ast, r)
    assert spec.lib[:4] == b"\x7fELF" and struct.unpack_from("<H", spec.lib, 18)[0] == 190
    ptx = r.compiler.to_ptx(spec.src)
    assert f".visible .entry {spec.name}(" in ptx and ptx.count(".param") == ref.src.count(".param")
    if "mma.sync" not in ref.src:  # NVPTX has no tensor cores, so a TC kernel launches a different grid there
      assert spec.global_size == ref.global_size and spec.local_size == ref.local_size


def test_ptx_half_kernels_use_f16_and_float_math():
  srcs = "\n".join(s.src for s in compiled("PTX", "low_precision"))
  assert "ld.global.b16" in srcs and "cvt.f32.f16" in srcs and "ex2.approx.f32" in srcs


def test_ptx_half_and_bf16_matmuls_use_tensor_cores():
  """The model's half and bf16 matmuls get the TC opt from the heuristics: mma.sync appears in their PTX."""
  srcs = [s.src for s in compiled("PTX", "low_precision")]
  mma = [s for s in srcs if "mma.sync.aligned.m16n8k16" in s]
  assert any(".f16.f16" in s for s in mma) and any(".bf16.bf16" in s for s in mma), f"{len(mma)} mma kernels"


# ***** AMDGPU: code objects *****
def elf_facts(lib: bytes) -> dict[str, Any]:
  """What the test checks of a code object, decoded by pyelftools (ELF) and msgpack (the AMDGPU metadata note): two
  registry packages independent of our linker and of our msgpack reader."""
  import io

  import msgpack
  from elftools.elf.elffile import ELFFile
  elf = ELFFile(io.BytesIO(lib))
  syms = {s.name: (s["st_value"], s["st_size"], s["st_info"]["type"], s["st_info"]["bind"])
          for sec in elf.iter_sections() if sec["sh_type"] in ("SHT_SYMTAB", "SHT_DYNSYM") for s in sec.iter_symbols()}
  meta = None
  for seg in elf.iter_segments():
    if seg["p_type"] != "PT_NOTE": continue
    for note in seg.iter_notes():
      if note["n_name"] == "AMDGPU" and note["n_type"] == 32:  # NT_AMDGPU_METADATA (LLVM AMDGPUUsage)
        desc = note["n_desc"]
        meta = msgpack.unpackb(desc if isinstance(desc, bytes) else desc.encode("latin-1"), raw=False)
  return {"type": elf["e_type"], "machine": elf["e_machine"], "osabi": elf["e_ident"]["EI_OSABI"],
          "flags": elf["e_flags"], "segments": [seg["p_type"] for seg in elf.iter_segments()], "symbols": syms,
          "metadata": meta}


def kernarg_size(src: str) -> int:
  """Bytes of kernel arguments in a rendered AMDGPU kernel: 8 per pointer, 4 per int, naturally aligned."""
  sig = re.search(r"amdgpu_kernel void @\w+\((.*)\) #0", src)
  assert sig is not None
  n = 0
  for arg in filter(None, sig.group(1).split(", ")):
    size = 8 if arg.startswith("ptr") else 4
    n = (n + size - 1) // size * size + size
  return n


@pytest.mark.parametrize("model", list(MODELS))
def test_amd_code_objects_have_kernel_descriptors(model):
  for spec in compiled("AMDGPU", model):
    f = elf_facts(spec.lib)
    assert (f["type"], f["machine"]) == ("ET_DYN", "EM_AMDGPU")  # a shared object for AMDGPU
    # ELFOSABI_AMDGPU_HSA = 64 (LLVM AMDGPUUsage); pyelftools names that number after ARM's EABI, which shares it
    assert f["osabi"] in ("ELFOSABI_AMDGPU_HSA", "ELFOSABI_ARM_AEABI") and spec.lib[7] == 64
    assert f["flags"] & 0xFF == 0x41  # EF_AMDGPU_MACH_AMDGCN_GFX1100
    for seg in ("PT_LOAD", "PT_DYNAMIC", "PT_NOTE"): assert seg in f["segments"], seg
    kd, fn = f["symbols"].get(f"{spec.name}.kd"), f["symbols"].get(spec.name)
    assert kd is not None and kd[1:] == (64, "STT_OBJECT", "STB_GLOBAL"), f"{spec.name}.kd: {kd}"
    assert fn is not None and fn[2:] == ("STT_FUNC", "STB_GLOBAL"), f"{spec.name}: {fn}"
    kmeta = [k for k in f["metadata"]["amdhsa.kernels"] if k[".name"] == spec.name]
    assert len(kmeta) == 1 and kmeta[0][".kernarg_segment_size"] == kernarg_size(spec.src), kmeta
    # the descriptor itself (AMDGPU kernel descriptor layout, llvm AMDGPUUsage "Kernel Descriptor"):
    # +0 group_segment_fixed_size, +8 kernarg_size, +16 kernel_code_entry_byte_offset (from the .kd to the code)
    kd_addr, fn_addr = kd[0], fn[0]
    desc = _read_vaddr(spec.lib, kd_addr, 64)
    group, _, kargs, entry = struct.unpack_from("<IIIxxxxq", desc, 0)
    assert kargs == kernarg_size(spec.src) and kd_addr + entry == fn_addr
    assert group == lds_bytes(spec.src)  # the grouped reductions' LDS, 0 for the others


def lds_bytes(src: str) -> int:
  """Bytes of LDS (`addrspace(3)` arrays) a rendered AMDGPU kernel declares."""
  sizes = {"float": 4, "half": 2, "i32": 4, "i64": 8, "double": 8, "i8": 1, "i16": 2, "i1": 1}
  return sum(int(n) * sizes[t] for n, t in re.findall(r"addrspace\(3\) global \[(\d+) x (\w+)\]", src))


def _read_vaddr(lib: bytes, vaddr: int, n: int) -> bytes:
  """`n` bytes at virtual address `vaddr` of an ELF64 file, through its PT_LOAD program headers."""
  phoff, = struct.unpack_from("<Q", lib, 32)
  phentsize, phnum = struct.unpack_from("<HH", lib, 54)
  for i in range(phnum):
    p_type, _, off, va, _, filesz = struct.unpack_from("<IIQQQQ", lib, phoff + i * phentsize)
    if p_type == 1 and va <= vaddr < va + filesz: return lib[off + vaddr - va:off + vaddr - va + n]
  raise AssertionError(f"address {vaddr:#x} is in no PT_LOAD segment")


def test_amd_descriptor_records_lds_size():
  from tiny_codegen.compiler.amdgpu import AMDGPUCompiler
  from tiny_codegen.renderer.amdgpu import AMDGPURenderer
  import test_gpu_render as m
  lib = AMDGPUCompiler("gfx1100").compile(AMDGPURenderer("gfx1100").render(m.shared_reverse_program(16)))
  assert struct.unpack_from("<H", lib, 16)[0] == 3 and struct.unpack_from("<H", lib, 18)[0] == 224  # ET_DYN, EM_AMDGPU
  assert lib[7] == 64  # ELFOSABI_AMDGPU_HSA
  # find shared_reverse.kd through the dynamic symbol table the loader uses
  syms = _dynsyms(lib)
  desc = _read_vaddr(lib, syms["shared_reverse.kd"], 64)
  assert struct.unpack_from("<I", desc, 0)[0] == 64  # group_segment_fixed_size: the 16-float LDS tile
  assert struct.unpack_from("<I", desc, 8)[0] == 16  # two buffer pointers


def _dynsyms(lib: bytes) -> dict[str, int]:
  shoff, = struct.unpack_from("<Q", lib, 40)
  shentsize, shnum = struct.unpack_from("<HH", lib, 58)
  secs = [struct.unpack_from("<IIQQQQIIQQ", lib, shoff + i * shentsize) for i in range(shnum)]
  out = {}
  for _, sh_type, _, _, off, size, link, _, _, entsize in secs:
    if sh_type != 11: continue  # SHT_DYNSYM
    stroff = secs[link][4]
    for j in range(size // entsize):
      name, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", lib, off + j * entsize)
      end = lib.index(b"\0", stroff + name)
      out[lib[stroff + name:end].decode()] = value
  return out


# ***** OpenCL: clang checked every kernel; PoCL builds them *****
@pytest.mark.skipif(find_clang() is None, reason="clang not installed (apt-get install clang)")
@pytest.mark.parametrize("model", list(MODELS))
def test_opencl_kernels_pass_clang(model):
  for spec in compiled("OPENCL", model):
    assert spec.lib == spec.src.encode() and f"__kernel void {spec.name}(" in spec.src


def test_opencl_kernels_build_on_pocl():
  import gpu_cl_runner as clr
  if (why := clr.available()) is not None: pytest.skip(why)
  specs = compiled("OPENCL", "transformer")
  for spec in specs: assert clr.build(spec.src, spec.name)  # a non-NULL cl_kernel


@pytest.mark.parametrize("dev,cls,arch", [("NULL:AMD:gfx90a", "AMDGPURenderer", "gfx90a"),
                                          ("NULL:CL", "OpenCLRenderer", ""), ("NULL:NV:sm_80", "PTXRenderer", "sm_80")])
def test_null_device_aliases(dev, cls, arch):
  from tiny_tensor import Device
  with Context(DEV=dev): r = Device["NULL"].renderer
  assert type(r).__name__ == cls and r.arch == (arch or r.arch)


@pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed (apt-get install lld)")
@pytest.mark.parametrize("model", ["convnet", "transformer"])
def test_amd_our_linker_matches_ld_lld(model):
  # every kernel of the model, linked by us (the default) and by ld.lld: same exports, code, metadata and descriptor
  comp = AMDGPUCompiler("gfx1100")
  for spec in compiled("AMDGPU", model):
    obj = comp.compile_object(spec.src)
    ours, lld = comp.link(obj), comp.link_lld(obj)
    assert ours == spec.lib
    s_ours, s_lld = _dynsyms(ours), _dynsyms(lld)
    assert set(s_ours) == set(s_lld) == {"", spec.name, f"{spec.name}.kd"}
    assert read_metadata(ours) == read_metadata(lld)
    (_, sec_ours), (_, sec_lld) = parse_elf(ours), parse_elf(lld)
    for name in (".text", ".note"):  # the same machine code and metadata note
      assert next(x.data for x in sec_ours if x.name == name) == next(x.data for x in sec_lld if x.name == name)
    kd_ours, kd_lld = _read_vaddr(ours, s_ours[f"{spec.name}.kd"], 64), _read_vaddr(lld, s_lld[f"{spec.name}.kd"], 64)
    assert kd_ours[:16] == kd_lld[:16] and kd_ours[24:] == kd_lld[24:]  # all but the layout-dependent entry offset
    for lib, syms in ((ours, s_ours), (lld, s_lld)):
      assert syms[f"{spec.name}.kd"] + struct.unpack_from("<q", _read_vaddr(lib, syms[f"{spec.name}.kd"], 64), 16)[0] \
        == syms[spec.name]


# ***** numbers: the models' OpenCL kernels (grouped reductions included) replayed on PoCL *****
@pytest.mark.parametrize("model", ["convnet", "transformer"])
def test_models_replayed_on_pocl_match_reference(model, monkeypatch):
  """Every kernel of the model -- random init, forward, backward -- compiled for NULL:OPENCL (GROUPTOP reductions in
  shared memory among them), run in order on PoCL; the outputs equal the same model (same seed) on the PYTHON
  device, unoptimized (the reference interpreter, no workgroup reductions)."""
  import gpu_cl_runner as clr
  if (why := clr.available()) is not None: pytest.skip(why)
  from tiny_tensor import creation
  from tiny_uop.device import Buffer
  uploads: dict = {}  # data written straight into NULL buffers (the random counters): the NULL device drops it
  copyin = Buffer.copyin

  def record(self: Buffer, mv: memoryview) -> Buffer:
    if self.device.startswith("NULL"): uploads[self] = np.frombuffer(bytes(mv), np.dtype(self.dtype.fmt)).copy()
    return copyin(self, mv)
  monkeypatch.setattr(Buffer, "copyin", record)
  monkeypatch.setattr(creation, "_rng_index", {})  # the random index buffers get uploaded (recorded) afresh
  calls: list = []
  Tensor.manual_seed(7)
  with Context(DEV=TARGETS["OPENCL"]), engine.capture(calls.append):
    outs = MODELS[model]("NULL")
    Tensor.realize(*outs)
  assert sum("__local" in c.spec.src for c in calls if c.kind == "kernel") >= 5
  arrs = clr.replay(calls, uploads)
  Tensor.manual_seed(7)
  with Context(DEV="PYTHON", NOOPT=1): refs = [t.numpy() for t in MODELS[model]("PYTHON")]
  for t, ref in zip(outs, refs):
    view = engine.buffer_view(t.uop)
    assert view is not None
    got = arrs[engine.get_buffer(view[0])]
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
