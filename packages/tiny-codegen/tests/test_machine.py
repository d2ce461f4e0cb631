"""The machine model (`tiny_codegen.machine`) read from fake sysfs trees of real CPUs, and the CPU heuristics'
thresholds and choices following it. Cache sizes are the vendors' published ones (AMD Zen 3/Zen 4 and Intel
Sapphire Rapids product pages, Arm's Neoverse N1 TRM); the trees have the files Linux writes for them."""
from __future__ import annotations

import os

import numpy as np
import pytest
from tiny_uop.plugins import Device

from tiny_codegen.machine import DEFAULTS, L3_SHARE_MAX_L2, Machine, host_machine, parse_overrides
from tiny_codegen.opt import Opt, OptOps, optimize_kernel

KB, MB = 1 << 10, 1 << 20
X86_AVX2 = "flags\t\t: fpu sse sse2 avx avx2 fma\n"
X86_AVX512 = "flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw\n"
ARM = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"


def fake_tree(root: str, cpuinfo: str, caches: list[tuple[int, str, str, str, int]], online: str = "0-7") -> str:
  """A sysfs + cpuinfo tree under `root`: caches as (level, type, size, shared_cpu_list, ways)."""
  os.makedirs(os.path.join(root, "proc"))
  with open(os.path.join(root, "proc/cpuinfo"), "w") as f: f.write(f"processor\t: 0\n{cpuinfo}\n")
  cpu = os.path.join(root, "sys/devices/system/cpu")
  os.makedirs(cpu)
  with open(os.path.join(cpu, "online"), "w") as f: f.write(online + "\n")
  for i, (level, kind, size, shared, ways) in enumerate(caches):
    d = os.path.join(cpu, f"cpu0/cache/index{i}")
    os.makedirs(d)
    for name, val in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared),
                      ("ways_of_associativity", ways), ("coherency_line_size", 64)):
      with open(os.path.join(d, name), "w") as f: f.write(f"{val}\n")
  return root


# (cpuinfo, caches, online CPUs) of one core complex / socket as its Linux sysfs lists them
TREES = {
  "znver3": (X86_AVX2, [(1, "Data", "32K", "0", 8), (1, "Instruction", "32K", "0", 8), (2, "Unified", "512K", "0", 8),
                        (3, "Unified", "32768K", "0-7", 16)], "0-7"),
  "znver4": (X86_AVX512, [(1, "Data", "32K", "0", 8), (2, "Unified", "1024K", "0", 8),
                          (3, "Unified", "32768K", "0-7", 16)], "0-7"),
  "sapphire_rapids": (X86_AVX512, [(1, "Data", "48K", "0", 12), (1, "Instruction", "32K", "0", 8),
                                   (2, "Unified", "2048K", "0", 16), (3, "Unified", "107520K", "0-55", 15)], "0-55"),
  "neoverse_n1": (ARM, [(1, "Data", "64K", "0", 4), (1, "Instruction", "64K", "0", 4), (2, "Unified", "1024K", "0", 8)],
                  "0-79"),
  "no_cache_info": (X86_AVX512, [], "0-3"),
}


@pytest.fixture(params=sorted(TREES))
def tree(request, tmp_path) -> tuple[str, Machine]:
  cpuinfo, caches, online = TREES[request.param]
  return request.param, Machine.from_sysfs(fake_tree(str(tmp_path), cpuinfo, caches, online))


# name: (arch, vector bytes, registers, L1d, L1d ways, L2, L3, CPUs sharing L3, cores)
WANT = {
  "znver3": ("x86_64", 32, 16, 32 * KB, 8, 512 * KB, 32 * MB, 8, 8),
  "znver4": ("x86_64", 64, 32, 32 * KB, 8, 1 * MB, 32 * MB, 8, 8),
  "sapphire_rapids": ("x86_64", 64, 32, 48 * KB, 12, 2 * MB, 105 * MB, 56, 56),
  "neoverse_n1": ("aarch64", 16, 32, 64 * KB, 4, 1 * MB, 0, 8, 80),  # no L3 listed (the SLC is not a CPU cache)
  "no_cache_info": ("x86_64", 64, 32, DEFAULTS["l1d"], DEFAULTS["l1d_ways"], DEFAULTS["l2"], DEFAULTS["l3"],
                    DEFAULTS["l3_shared"], 4),
}


def test_model_read_from_sysfs(tree) -> None:
  name, m = tree
  got = (m.arch, m.vector_bytes, m.vector_registers, m.l1d, m.l1d_ways, m.l2, m.l3, m.l3_shared, m.cores)
  assert got == WANT[name], (name, m)
  assert m.fma_units == 2 and m.line == 64 and m.page_size == 4096


# name: (L3 share a core, L1d set span, B from which a contiguous B is packed, B above which rows are tiled: the L2,
# or the L3 share where that is smaller)
DERIVED = {
  "znver3": (4 * MB, 4 * KB, 512 * KB, 512 * KB),        # AVX2: 4-row block, B packed from the L2
  "znver4": (4 * MB, 4 * KB, 2 * MB, 1 * MB),            # AVX-512: 8-row block, from two L2s
  "sapphire_rapids": (105 * MB // 56, 4 * KB, 4 * MB, 105 * MB // 56),  # 1.9 MB of L3 a core, under its 2 MB L2
  "neoverse_n1": (1 * MB, 16 * KB, 2 * MB, 1 * MB),      # no L3: the L2 is the last level
  "no_cache_info": (4 * MB, 4 * KB, 2 * MB, 1 * MB),     # the stated defaults: Zen 4's caches
}


def test_thresholds_follow_the_caches(tree) -> None:
  from tiny_codegen.opt.heuristic import pack_min_bytes, tile_bytes, tile_min_bytes
  from tiny_codegen.opt.heuristic_common import alias_bytes
  name, m = tree
  share, span, pack, tile_min = DERIVED[name]
  assert (m.l3_per_core, alias_bytes(m), pack_min_bytes(m, m.vector_registers), tile_min_bytes(m)) == \
    (share, span, pack, tile_min), name
  assert tile_bytes(m) == share // 2


def test_vm_l3_share_is_capped() -> None:
  # a 2-vCPU guest sees the host's whole L3 as shared by its two CPUs: its share is capped at L3_SHARE_MAX_L2 L2s
  m = Machine.default().with_overrides("l2=2M,l3=300M,l3_shared=2")
  assert m.l3_per_core == L3_SHARE_MAX_L2 * 2 * MB


class _Target:
  """A renderer stand-in for `gemm_panel`: a register file and a machine."""
  def __init__(self, m: Machine) -> None: self.vector_registers, self.machine = (m.vector_registers, m.vector_bytes), m


@pytest.mark.parametrize("m, k, n, strided, want", [
  (1024, 256, 1024, False, {"znver3": 16, "znver4": 0, "sapphire_rapids": 0, "neoverse_n1": 0, "no_cache_info": 0}),
  (1024, 512, 1024, False, {"znver3": 16, "znver4": 32, "sapphire_rapids": 0, "neoverse_n1": 0, "no_cache_info": 32}),
  (1024, 1024, 1024, False, {"znver3": 16, "znver4": 32, "sapphire_rapids": 32, "neoverse_n1": 0,
                             "no_cache_info": 32}),
  (64, 512, 512, True, {"znver3": 16, "znver4": 32, "sapphire_rapids": 0, "neoverse_n1": 0, "no_cache_info": 32}),
  # nn.Linear's layout at a 32-token prefill (x @ w.T, w 768 x 768: 2.4 MB, past every L2): 4 blocks of 8 rows on
  # AVX-512, 8 of 4 on AVX2, so packed (`pack_min_rows_strided`); 16 rows: 4 of AVX2's blocks, 2 of AVX-512's (in
  # place); 8 rows, one AVX-512 block or two AVX2 ones: in place everywhere
  (32, 768, 768, True, {"znver3": 16, "znver4": 32, "sapphire_rapids": 32, "neoverse_n1": 0, "no_cache_info": 32}),
  (16, 768, 768, True, {"znver3": 16, "znver4": 0, "sapphire_rapids": 0, "neoverse_n1": 0, "no_cache_info": 0}),
  (8, 768, 768, True, {n: 0 for n in TREES}),
  # a contiguous B still needs `PACK_MIN_ROWS`
  (32, 1024, 1024, False, {n: 0 for n in TREES}),
])
def test_packing_follows_the_l2(tree, m: int, k: int, n: int, strided: bool, want: dict) -> None:
  # B of 1 MB (256 x 1024) fills znver3's 512 KB L2 (packed, 16-column AVX2 panels) but not the AVX-512 machines'
  # two L2s; 2 MB fills znver4's (1 MB) two but not Sapphire Rapids' (2 MB) ; NEON's 16-byte vectors aren't packed
  from tiny_codegen.opt.heuristic import gemm_panel
  name, mach = tree
  assert gemm_panel(_Target(mach), m, k, n, 4, strided) == want[name]  # type: ignore[arg-type]


@pytest.mark.parametrize("cout, taps, want", [
  (256, 256 * 9, {"znver3": 16, "znver4": 16, "sapphire_rapids": 16, "neoverse_n1": 16, "no_cache_info": 16}),
  (128, 128 * 9, {"znver3": 16, "znver4": 0, "sapphire_rapids": 0, "neoverse_n1": 0, "no_cache_info": 0}),
  (512, 256 * 9, {"znver3": 16, "znver4": 16, "sapphire_rapids": 16, "neoverse_n1": 16, "no_cache_info": 16}),
  (64, 64 * 9, {"znver3": 0, "znver4": 0, "sapphire_rapids": 0, "neoverse_n1": 0, "no_cache_info": 0}),
  (200, 4096, {n: 0 for n in TREES}),  # 200 channels (3.3 MB): not a multiple of a 16-float panel
  (16, 1 << 16, {n: 0 for n in TREES}),  # one panel: channels-last is already contiguous
])
def test_conv_weight_panels_follow_the_l2(tree, cout: int, taps: int, want: dict) -> None:
  # a conv weight (float32) bigger than the L2 is laid out in panels of one cache line of output channels: resnet's
  # 256 -> 256 3x3 (2.4 MB) on every machine here, 128 -> 128 (0.6 MB) only past znver3's 512 KB L2
  from tiny_codegen.opt.heuristic import conv_weight_panel
  name, mach = tree
  assert conv_weight_panel(_Target(mach), cout, taps, 4) == want[name]  # type: ignore[arg-type]
  no_vectors = _Target(mach)
  no_vectors.vector_registers = (0, 0)
  assert conv_weight_panel(no_vectors, cout, taps, 4) == 0  # type: ignore[arg-type]


def _run_on_cpu(spec, shape: tuple[int, int], a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Run a compiled two-input float32 kernel (output slot 0, inputs 1 and 2) on the CPU device; its output."""
  from tiny_uop import dtypes
  from tiny_uop.device import Buffer
  dev = Device["CPU"]
  bufs = [Buffer("CPU", shape[0] * shape[1], dtypes.float).allocate()] + \
    [Buffer("CPU", x.size, dtypes.float, initial_value=x.tobytes()) for x in (a, b)]
  prg = dev.get_program(spec.name, spec.lib)
  prg(*[bufs[s]._buf for s in spec.globals], global_size=spec.global_size, local_size=spec.local_size, vals=(),
      wait=True)
  return np.frombuffer(bufs[0].as_buffer(), dtype=np.float32).reshape(shape)


def _matmul_ast(M: int, N: int, K: int, opts: tuple | None = None):
  from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((M * N, M * K, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(opts_to_apply=opts))


@pytest.fixture
def on_machine(monkeypatch):
  """Make the CPU renderer's heuristics see machine `m` (its caches and register file)."""
  ren = Device["CPU"].renderer
  if not hasattr(ren, "machine"): pytest.skip(f"{type(ren).__name__} has no machine model (DEV=CPU:CLANG)")

  def use(m: Machine) -> None:
    monkeypatch.setattr(type(ren), "machine", property(lambda self: m))
    monkeypatch.setattr(type(ren), "vector_registers", property(lambda self: (m.vector_registers, m.vector_bytes)))
    monkeypatch.setattr(ren, "threads", 2)
  return use


@pytest.mark.parametrize("k, want", [
  # 1024 x 512 @ 512 x 1024, B 2 MB: past every model's L2 (Sapphire Rapids: its 1.9 MB L3 share) the rows are
  # tiled, each tile at most half the L3 share of A and at least one a thread (2): znver3's 4-row blocks of 8 KB,
  # 2 MB a tile: 256 blocks, 128 a thread; znver4's 8-row blocks of 16 KB: 128, 64 a thread; Sapphire Rapids' 16 KB
  # blocks in 0.94 MB: 60, whose largest divisor of 128 is 32; Neoverse N1 (NEON's 8-row block, 512 KB): 32
  (512, {"znver3": 128, "znver4": 64, "sapphire_rapids": 32, "neoverse_n1": 32, "no_cache_info": 64}),
  # 1024 x 128 @ 128 x 1024, B 512 KB: within every L2 but znver3's (512 KB is not past it): untiled
  (128, {}),
])
def test_row_tiles_follow_the_l2(tree, on_machine, k: int, want: dict) -> None:
  """Whether and how far a matmul's rows are tiled follows the model's L2 (`tile_min_bytes`) and L3 share
  (`tile_bytes`)."""
  name, m = tree
  on_machine(m)
  applied = optimize_kernel(_matmul_ast(1024, 1024, k), Device["CPU"].renderer).arg.applied_opts
  tiles = [o for o in applied if o.op is OptOps.TILE]
  assert tiles == ([Opt(OptOps.TILE, 0, want[name])] if name in want else []), (name, applied)


@pytest.mark.parametrize("name", ["sapphire_rapids", "znver3", "znver4"])
def test_tiled_matmul_matches_numpy(on_machine, name: str) -> None:
  """The kernel each model tiles (B of 2 MB past its L2) computes the product numpy does."""
  cpuinfo, caches, online = TREES[name]
  import tempfile
  with tempfile.TemporaryDirectory() as d: m = Machine.from_sysfs(fake_tree(d, cpuinfo, caches, online))
  on_machine(m)
  from tiny_codegen import get_program
  M, N, K = 256, 1024, 512  # B 2 MB, past each L2: tiled
  dev = Device["CPU"]
  applied = optimize_kernel(_matmul_ast(M, N, K), dev.renderer).arg.applied_opts
  assert any(o.op is OptOps.TILE for o in applied), applied
  spec = get_program(_matmul_ast(M, N, K, applied), dev.renderer)
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  got = _run_on_cpu(spec, (M, N), a, b)
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


def test_overrides_and_bad_values(monkeypatch) -> None:
  m = Machine.default().with_overrides("l2=512K, l3=64M,l3_shared=16,vector_registers=16,vector_bytes=32,arch=x86_64")
  assert (m.l2, m.l3, m.l3_shared, m.vector_registers, m.vector_bytes) == (512 * KB, 64 * MB, 16, 16, 32)
  monkeypatch.setenv("TINY_MACHINE", "l2=3M")
  assert host_machine().l2 == 3 * MB
  with pytest.raises(ValueError, match="l4"): parse_overrides("l4=1M")
  with pytest.raises(ValueError, match="'lots'"): parse_overrides("l2=lots")
  with pytest.raises(ValueError, match="field=value"): parse_overrides("l2")


def test_host_model_reads_this_machine() -> None:
  """The real machine's model: the cores this process may use, the page size and (where sysfs lists it) the L1d."""
  m = Machine.from_sysfs("/")
  assert m.cores == len(os.sched_getaffinity(0)) and m.page_size == os.sysconf("SC_PAGE_SIZE")
  idx0 = "/sys/devices/system/cpu/cpu0/cache/index0"
  if os.path.exists(f"{idx0}/size") and open(f"{idx0}/type").read().strip() == "Data":
    size = open(f"{idx0}/size").read().strip()
    assert m.l1d == int(size[:-1]) << 10 and size.endswith("K")


def test_cpu_renderer_threads_are_the_cores_this_process_may_use(monkeypatch) -> None:
  """Without CPU_THREADS, a CPU renderer splits kernels into one share per core of the machine model: the CPUs in
  this process's affinity mask (what the CPU runtime's pool runs), not `os.cpu_count()`."""
  from tiny_codegen.renderer import CPURenderer
  from tiny_uop.helpers import Context
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})  # pinned to 3 CPUs, whatever the host has
  monkeypatch.setattr(os, "cpu_count", lambda: 64)
  monkeypatch.setenv("TINY_MACHINE", "page_size=4096")  # a model not cached yet: read under the patched mask
  with Context(CPU_THREADS=0):
    assert CPURenderer().threads == 3
    monkeypatch.setenv("TINY_MACHINE", "cores=5")
    assert CPURenderer().threads == 5
  with Context(CPU_THREADS=7): assert CPURenderer().threads == 7


@pytest.mark.parametrize("spec, want", [
  ("l2=1M,l3=32M,l3_shared=2,cores=2", 8 * MB),    # a 2-vCPU znver4 guest: 8 MB shares (capped at 8 L2s) x 2 / 2
  ("l2=2M,l3=300M,l3_shared=2,cores=2", 16 * MB),  # a 2-vCPU Xeon guest seeing the host's 300 MB L3
  ("l2=1M,l3=32M,l3_shared=8,cores=8", 16 * MB),   # a whole Zen 4 CCX: half its L3
  ("l2=1M,l3=0,cores=4", 2 * MB),                  # no L3 (Neoverse N1 as sysfs lists it): half the 4 L2s
])
def test_streaming_stores_follow_the_l3(monkeypatch, spec: str, want: int) -> None:
  from tiny_codegen.renderer import CPURenderer
  monkeypatch.setenv("TINY_MACHINE", spec)
  assert CPURenderer().nontemporal_min_bytes == want


def test_beam_can_search_the_row_tile(on_machine) -> None:
  """The row tile the heuristics size from the L3 share is one of BEAM's actions too: from the heuristics' blocked
  matmul, some TILE action applies (BEAM can try another tile size or add one)."""
  from tiny_codegen.opt.heuristic import hand_coded_optimizations
  from tiny_codegen.opt.kernel import Kernel, KernelOptError
  from tiny_codegen.opt.search import ACTIONS, as_optimized
  on_machine(Machine.default())
  ast = as_optimized(_matmul_ast(512, 512, 512))
  heur = hand_coded_optimizations(Kernel(ast, Device["CPU"].renderer)).applied_opts
  legal = []
  for act in (a for a in ACTIONS if a.op is OptOps.TILE):
    k = Kernel(ast, Device["CPU"].renderer)
    for o in heur: k.apply_opt(o)
    try: k.apply_opt(act)
    except KernelOptError: continue
    legal.append(act)
  assert legal and all(o.arg in (8, 16, 32, 64, 128) for o in legal), (heur, legal)


def test_unknown_vector_file_defers_to_llvm(tmp_path, monkeypatch) -> None:
  """An x86-64 tree without cpuinfo flags (macOS has no /proc) knows no vector file: the LLVM renderer then reports
  its target's (from LLVM's host features), instead of assuming SSE."""
  m = Machine.from_sysfs(fake_tree(str(tmp_path), "", [], "0"), arch="x86_64")
  assert (m.vector_bytes, m.vector_registers) == (0, 0)
  ren = Device["CPU"].renderer
  if not hasattr(ren, "machine"): pytest.skip(f"{type(ren).__name__} has no machine model (DEV=CPU:CLANG)")
  from tiny_codegen.renderer.llvmir import _vector_registers
  monkeypatch.setattr(type(ren), "machine", property(lambda self: m))
  assert ren.vector_registers == _vector_registers(ren.compiler.triple, ren.compiler.features)


@pytest.mark.parametrize("M, N, K, want", [
  # a 32-token prefill's 32 x 768 @ 768 x 768 (B 2.4 MB, past every model's L2 share; A 96 KB, within half of it):
  # the rows are one tile (8-row blocks on AVX-512 and NEON: 4; AVX2's 4-row blocks: 8), so B's column loop is the
  # outermost, the threads split it and B streams once; a tile per thread (2 blocks) would stream it once a thread
  (32, 768, 768, {"znver3": 8, "znver4": 4, "sapphire_rapids": 4, "neoverse_n1": 4, "no_cache_info": 4}),
  # 64 rows of 2048 (A 512 KB): within half the L2 share of all but znver3's (512 KB L2): a tile per thread there
  # (16 blocks of 4 rows, 8 a thread)
  (64, 2048, 2048, {"znver3": 8, "znver4": 8, "sapphire_rapids": 8, "neoverse_n1": 8, "no_cache_info": 8}),
  # 512 rows of 1024 (A 2 MB, past every half L2): tiles of at most half the rows, as before
  (512, 1024, 2048, {"znver3": 64, "znver4": 32, "sapphire_rapids": 8, "neoverse_n1": 8, "no_cache_info": 32}),
])
def test_skinny_rows_are_one_tile(tree, on_machine, M: int, N: int, K: int, want: dict) -> None:
  """A matmul whose A (all its rows) fits half the L2 share is tiled whole (`_whole_row_tile`) where B is past the
  L2; else a tile per thread at most."""
  name, m = tree
  on_machine(m)
  applied = optimize_kernel(_matmul_ast(M, N, K), Device["CPU"].renderer).arg.applied_opts
  tiles = [o for o in applied if o.op is OptOps.TILE]
  assert tiles == ([Opt(OptOps.TILE, 0, want[name])] if name in want else []), (name, applied)


@pytest.mark.parametrize("name", ["sapphire_rapids", "znver3"])
def test_whole_row_tile_matches_numpy(on_machine, name: str) -> None:
  """The skinny product tiled whole (its column loop split across the threads) computes what numpy does."""
  cpuinfo, caches, online = TREES[name]
  import tempfile
  with tempfile.TemporaryDirectory() as d: m = Machine.from_sysfs(fake_tree(d, cpuinfo, caches, online))
  on_machine(m)
  from tiny_codegen import get_program
  M, N, K = 32, 768, 768
  dev = Device["CPU"]
  applied = optimize_kernel(_matmul_ast(M, N, K), dev.renderer).arg.applied_opts
  assert Opt(OptOps.TILE, 0, M // (8 if name == "sapphire_rapids" else 4)) in applied, applied
  spec = get_program(_matmul_ast(M, N, K, applied), dev.renderer)
  assert spec.global_size[0] > 1, spec.global_size  # the threads split B's columns
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  got = _run_on_cpu(spec, (M, N), a, b)
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


# x @ W with a batch of M rows (M = 1 or 2: reuse below REUSE_MIN): N in vectors of the register's lanes, as many
# vectors as make M x v reach FMA latency (4) x FMA units (2 everywhere here) = 8 accumulators, the rows whole.
# AVX2 (32 B): 8 lanes; AVX-512: 16; NEON (16 B): 4.
LANES = {"znver3": 8, "znver4": 16, "sapphire_rapids": 16, "neoverse_n1": 4, "no_cache_info": 16}


@pytest.mark.parametrize("M, N, vectors", [
  (1, 768, 8),   # one row: 8 vectors of accumulators
  (2, 768, 4),   # two rows share each vector of W: 2 x 4
  # 1 x 128: 8 AVX-512 vectors would be all of N, one block for two threads: 4 (2 blocks); AVX2 keeps 8 (2 blocks)
  (1, 128, {"znver3": 8, "znver4": 4, "sapphire_rapids": 4, "neoverse_n1": 8, "no_cache_info": 4}),
  # N = 1000 (mobilenet_v3_small's classifier): 125 x 8, so half an AVX-512 register (8 lanes) and the most vectors
  # up to 8 that divide 125 blocks: 5 (NEON: 4 lanes, 250 = 5 x 50)
  (1, 1000, 5),
])
def test_matvec_blocks_follow_the_register_file(tree, on_machine, M: int, N: int, vectors) -> None:
  """`_matvec_block`: x @ W's N is upcast by the vector's lanes, then by the vectors that hide the FMA latency,
  leaving a block of N per thread; the batch rows whole."""
  name, m = tree
  on_machine(m)
  applied = optimize_kernel(_matmul_ast(M, N, 768), Device["CPU"].renderer).arg.applied_opts
  v = vectors[name] if isinstance(vectors, dict) else vectors
  lanes = min(LANES[name], 8) if N == 1000 else LANES[name]
  want = [Opt(OptOps.UPCAST, 1, lanes), Opt(OptOps.UPCAST, 1, v)]
  assert list(applied) == want + ([Opt(OptOps.UPCAST, 0, M)] if M > 1 else []), (name, applied)


def test_matvec_accumulators_follow_the_fma_units(tmp_path, on_machine) -> None:
  """One FMA unit (`TINY_MACHINE=fma_units=1`): 4 accumulators hide its latency, not 8."""
  import dataclasses

  from tiny_codegen.opt.heuristic import matvec_accumulators
  cpuinfo, caches, online = TREES["znver4"]
  m = Machine.from_sysfs(fake_tree(str(tmp_path), cpuinfo, caches, online))
  assert matvec_accumulators(m) == 8 and matvec_accumulators(dataclasses.replace(m, fma_units=1)) == 4
  on_machine(dataclasses.replace(m, fma_units=1))
  applied = optimize_kernel(_matmul_ast(1, 768, 768), Device["CPU"].renderer).arg.applied_opts
  assert list(applied) == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 1, 4)], applied


@pytest.mark.parametrize("name", ["znver3", "sapphire_rapids", "neoverse_n1"])
@pytest.mark.parametrize("M, K, N", [(1, 768, 768), (2, 100, 96), (1, 37, 64), (1, 64, 1000)])
def test_matvec_block_matches_numpy(on_machine, name: str, M: int, K: int, N: int) -> None:
  """The matvec block of each machine's register file, run on this CPU (LLVM legalizes wider vectors), computes
  what numpy does, an odd K included."""
  cpuinfo, caches, online = TREES[name]
  import tempfile
  with tempfile.TemporaryDirectory() as d: m = Machine.from_sysfs(fake_tree(d, cpuinfo, caches, online))
  on_machine(m)
  from tiny_codegen import get_program
  dev = Device["CPU"]
  applied = optimize_kernel(_matmul_ast(M, N, K), dev.renderer).arg.applied_opts
  assert Opt(OptOps.UPCAST, 1, min(LANES[name], 8) if N == 1000 else LANES[name]) in applied, applied
  spec = get_program(_matmul_ast(M, N, K, applied), dev.renderer)
  rng = np.random.default_rng(2)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  got = _run_on_cpu(spec, (M, N), a, b)
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(K))


def _linear_ast(M: int, N: int, K: int, opts: tuple | None = None):
  """y = x @ w.T (w N x K contiguous: nn.Linear's and ONNX Gemm transB's layout, each output a dot product)."""
  from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((M * N, M * K, N * K)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(j * K + k).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(opts_to_apply=opts))


@pytest.mark.parametrize("K, want", [
  # K a multiple of every vector (4, 8, 16 lanes): unrolled by 16, one accumulator a lane, no row lanes
  (96, {n: [Opt(OptOps.UNROLL, 0, 16)] for n in TREES}),
  # K = 100: a multiple of NEON's 4 lanes only; the others keep four rows sharing x (`_shared_load_block`)
  (100, {"neoverse_n1": [Opt(OptOps.UNROLL, 0, 4)],
         **{n: [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)] for n in TREES if n != "neoverse_n1"}}),
])
def test_dot_products_follow_the_vector_lanes(tree, on_machine, K: int, want: dict) -> None:
  """`_dot_products`: x @ W.T with one row is left to the K unroll's lane accumulators where K is a multiple of the
  register's lanes; the result matches numpy on this CPU."""
  name, m = tree
  on_machine(m)
  from tiny_codegen import get_program
  dev = Device["CPU"]
  M, N = 1, 64
  applied = optimize_kernel(_linear_ast(M, N, K), dev.renderer).arg.applied_opts
  assert list(applied) == want[name], (name, applied)
  spec = get_program(_linear_ast(M, N, K, applied), dev.renderer)
  rng = np.random.default_rng(3)
  a, w = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((N, K), dtype=np.float32)
  got = _run_on_cpu(spec, (M, N), a, w)
  np.testing.assert_allclose(got, a @ w.T, rtol=1e-4, atol=1e-4 * np.sqrt(K))


def test_fused_prologue_rows_follow_the_fma_units(tmp_path) -> None:
  """`_fused_prologue_block` (attention's P @ V with the softmax fused): its 2 rows x vectors a row are as many
  accumulators as `fma_chains` (8 with two FMA units: 4 vectors a row; one unit: 2)."""
  import dataclasses

  from tiny_codegen.opt.heuristic import FUSED_ROWS, fused_row_vectors
  cpuinfo, caches, online = TREES["sapphire_rapids"]
  m = Machine.from_sysfs(fake_tree(str(tmp_path), cpuinfo, caches, online))
  assert FUSED_ROWS == 2 and fused_row_vectors(m) == 4 and fused_row_vectors(dataclasses.replace(m, fma_units=1)) == 2


@pytest.mark.parametrize("k", [512, 1024, 1056, 2048, 4096, 4128, 6144])
def test_amx_blocks_follow_each_machines_l1d(tree, k: int) -> None:
  """The AMX tile kernel's blocks from each described machine's L1d: A's rows are padded (`a_row_pad`, N = 4096) iff
  the 32 rows a k step loads (K x 2 bytes apart) put more lines into one L1d set than it has ways, counted directly
  from the addresses (line index modulo the model's sets: an independent reference for the gcd rule), and after the
  pad no set holds more than its ways; the K block (`k_block`) is the largest multiple of 32 dividing K whose packed
  panel pair (64 bytes a k) takes at most two L1ds."""
  from tiny_codegen import x86_amx
  _, m = tree
  sets = m.l1d // (m.line * m.l1d_ways)

  def most_in_a_set(stride: int) -> int:
    count: dict[int, int] = {}
    for r in range(2 * x86_amx.TILE_ROWS):
      s = (r * stride // m.line) % sets
      count[s] = count.get(s, 0) + 1
    return max(count.values())

  pad = x86_amx.a_row_pad(4096, k, m.l1d_set_span, m.l1d_ways)
  assert pad == (x86_amx.K_STEP if most_in_a_set(k * 2) > m.l1d_ways else 0), (m.l1d, m.l1d_ways, k, pad)
  assert most_in_a_set((k + pad) * 2) <= m.l1d_ways
  kb = x86_amx.k_block(k, m.l1d)
  fits = [b for b in range(32, k + 1, 32) if k % b == 0 and b * 64 <= 2 * m.l1d]
  assert kb == (max(fits) if fits else 32), (m.l1d, k, kb)
