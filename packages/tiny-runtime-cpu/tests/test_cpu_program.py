"""CPU program loading and launching with hand-written kernels (the C ABI of PIPELINE.md §4), no codegen needed:
LLVM IR compiled by llvmlite to an ELF object (placed as `cpu.object_loader` says: our loader on x86-64, else MCJIT),
C compiled by clang to a shared object (ctypes), threads."""
import subprocess
import threading

import numpy as np
import pytest

from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device
from tiny_uop.tools import find_tool, tool_status
from tiny_runtime_cpu import cpu

# void name(float* d0, float* d1, float* d2, int n, int core_id): d0[i] = d1[i] OP d2[i] over this thread's share
LLVM_IR = """
define void @{name}(float* noalias %d0, float* noalias %d1, float* noalias %d2, i32 %n, i32 %core) {{
entry:
  %nt = add i32 %n, {nthreads_m1}
  %chunk = sdiv i32 %nt, {nthreads}
  %start = mul i32 %core, %chunk
  %end0 = add i32 %start, %chunk
  %lt = icmp slt i32 %end0, %n
  %end = select i1 %lt, i32 %end0, i32 %n
  %any = icmp slt i32 %start, %end
  br i1 %any, label %loop, label %exit
loop:
  %i = phi i32 [%start, %entry], [%i2, %loop]
  %p1 = getelementptr float, float* %d1, i32 %i
  %p2 = getelementptr float, float* %d2, i32 %i
  %p0 = getelementptr float, float* %d0, i32 %i
  %x = load float, float* %p1
  %y = load float, float* %p2
  %z = {op} float %x, %y
  store float %z, float* %p0
  %i2 = add i32 %i, 1
  %c = icmp slt i32 %i2, %end
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}
"""

C_SRC = """
void {name}(float* restrict d0, const float* restrict d1, const float* restrict d2, int n, int core_id) {{
  int chunk = (n + {nthreads} - 1) / {nthreads}, s = core_id * chunk, e = s + chunk < n ? s + chunk : n;
  for (int i = s; i < e; i++) d0[i] = d1[i] {op} d2[i];
}}
"""


def llvm_obj(name="k", op="fadd", nthreads=1) -> bytes:
  import llvmlite.binding as llvm
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  tm = llvm.Target.from_default_triple().create_target_machine(opt=2)
  mod = llvm.parse_assembly(LLVM_IR.format(name=name, op=op, nthreads=nthreads, nthreads_m1=nthreads - 1))
  mod.verify()
  return tm.emit_object(mod)


def clang_so(tmp_path, name="k", op="+", nthreads=1) -> bytes:
  cc = find_tool("cc")
  assert cc is not None, tool_status("cc")
  (tmp_path / "k.c").write_text(C_SRC.format(name=name, op=op, nthreads=nthreads))
  subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-o", str(tmp_path / "k.so"), str(tmp_path / "k.c")], check=True)
  return (tmp_path / "k.so").read_bytes()


def bufs(n, seed=0):
  rng = np.random.default_rng(seed)
  a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
  out = [Buffer("CPU", n, dtypes.float32).allocate() for _ in range(3)]
  out[1].copyin(memoryview(a))
  out[2].copyin(memoryview(b))
  return a, b, out


@pytest.mark.parametrize("nthreads", [1, 2, 7])
@pytest.mark.parametrize("kind", ["llvm", "clang"])
def test_run(kind, nthreads, tmp_path):
  lib = llvm_obj("add_f32", "fadd", nthreads) if kind == "llvm" else clang_so(tmp_path, "add_f32", "+", nthreads)
  a, b, (c, ab, bb) = bufs(1001)
  prg = Device["CPU"].get_program("add_f32", lib)
  t = prg(c._buf, ab._buf, bb._buf, global_size=(nthreads, 1, 1), vals=(1001,), wait=True)
  assert isinstance(t, float) and t > 0
  assert np.array_equal(c.numpy(), a + b)


@pytest.mark.parametrize("loader", ["", "MCJIT"])
def test_same_name_different_code(tmp_path, loader):
  """Two objects defining the same symbol must each run their own code (each its own mapping with our loader,
  different engines with MCJIT)."""
  a, b, (c, ab, bb) = bufs(64)
  dev, nm = Device["CPU"], f"same{loader}"
  with Context(CPU_LOADER=loader):
    p_add, p_mul = dev.get_program(nm, llvm_obj(nm, "fadd")), dev.get_program(nm, llvm_obj(nm, "fmul"))
  assert p_add.loader == p_mul.loader == (loader.lower() or cpu.object_loader(llvm_obj(nm, "fadd")))
  p_sub = dev.get_program(nm, clang_so(tmp_path, nm, "-"))
  for prg, want in ((p_add, a + b), (p_mul, a * b), (p_sub, a - b), (p_add, a + b)):
    prg(c._buf, ab._buf, bb._buf, vals=(64,))
    assert np.array_equal(c.numpy(), want)


def test_bad_binaries():
  dev = Device["CPU"]
  with pytest.raises(ValueError, match="expected an ELF"): dev.get_program("x", b"not an elf at all")
  with pytest.raises(ValueError, match="defines no function"): dev.get_program("missing", llvm_obj("present"))


def test_concurrent_launches():
  """1,000 small launches from each of two Python threads, some split over the pool: all correct, no crash."""
  dev = Device["CPU"]
  lib1, lib4 = llvm_obj("cc1", "fadd", 1), llvm_obj("cc4", "fmul", 4)
  errors: list[str] = []

  def worker(seed):
    a, b, (c, ab, bb) = bufs(97, seed)
    p1, p4 = dev.get_program("cc1", lib1), dev.get_program("cc4", lib4)
    for i in range(1000):
      prg, want, gs = (p1, a + b, 1) if i % 2 else (p4, a * b, 4)
      prg(c._buf, ab._buf, bb._buf, global_size=(gs, 1, 1), vals=(97,))
      if not np.array_equal(c.numpy(), want): errors.append(f"thread {seed} launch {i}")
  ts = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert errors == []


def test_pool_propagates_errors_and_runs_every_share():
  from tiny_runtime_cpu.threads import ThreadPool
  pool = ThreadPool(3)
  seen: list[int] = []
  lock = threading.Lock()

  def share(i):
    with lock: seen.append(i)
  pool.run(share, 50)
  assert sorted(seen) == list(range(50))

  def bad(i):
    if i == 5: raise KeyError("share 5")
  with pytest.raises(KeyError, match="share 5"): pool.run(bad, 8)
  pool.close()


def test_renderer_selection():
  from tiny_uop.helpers import Context
  dev = Device["CPU"]
  if not dev.renderer_classes: pytest.skip("tiny-codegen's CPU renderers are not importable yet")
  names = [c.__name__ for c in dev.renderer_classes]
  with Context(DEV="CPU"): assert type(dev.renderer).__name__ == names[0]  # the first is the default
  if "LLVMRenderer" in names:
    assert names[0] == "LLVMRenderer"
    with Context(DEV="CPU:LLVM"): assert type(dev.renderer).__name__ == "LLVMRenderer"
  if "ClangRenderer" in names:
    with Context(DEV="CPU:CLANG"): assert type(dev.renderer).__name__ == "ClangRenderer"
  with Context(DEV="CPU:NOPE"), pytest.raises(ValueError, match="no renderer 'NOPE'"): dev.renderer  # noqa: B018
  rname = names[0].removesuffix("Renderer").upper()
  with Context(DEV=f"CPU:{rname}:someArch"): assert dev.renderer.arch == "someArch"
  with Context(DEV=f"CPU:{rname}"): assert dev.renderer.arch == ""  # an arch never sticks to the device


def test_clang_missing_message(monkeypatch):
  import tiny_runtime_cpu.cpu as cpu
  monkeypatch.setattr(cpu, "find_tool", lambda name: None)
  with pytest.raises(RuntimeError, match=r"needs a C compiler \(clang or gcc\).*pip install ziglang.*CPU:LLVM"):
    Device["CPU"].select_renderer("CLANG")


def test_cpu_clang_needs_any_c_compiler_not_clang(monkeypatch):
  """DEV=CPU:CLANG takes whichever C compiler find_tool("cc") gives (here: gcc's name, with no clang anywhere)."""
  import tiny_runtime_cpu.cpu as cpu
  monkeypatch.setattr(cpu, "find_tool", lambda name: ["/usr/bin/gcc"] if name == "cc" else None)
  assert type(Device["CPU"].select_renderer("CLANG")).__name__ == "ClangRenderer"


def _c_compilers() -> dict[str, list[str]]:
  """Every C compiler on this machine: ziglang's (a test dependency: always), and clang and gcc where installed."""
  import shutil
  out = {"zig cc": _zig_cc()}
  for name in ("clang", "gcc"):
    if (p := shutil.which(name)) is not None: out[name] = [p]
  return out


def _zig_cc() -> list[str]:
  from tiny_uop.tools import TOOLS, _bundled
  cmd = next((c for b in TOOLS["cc"].bundled if (c := _bundled(b)) is not None), None)
  assert cmd is not None, "ziglang (a test dependency) is not installed"
  return cmd


@pytest.mark.parametrize("compiler", list(_c_compilers()))
def test_c_renderer_runs_with_each_c_compiler(compiler, monkeypatch):
  """The C renderer's kernels (float, half, int) compile and run with every C compiler there is, gcc included."""
  from tiny_codegen import get_program
  from tiny_codegen.renderer.cstyle import ClangRenderer
  from tiny_uop import KernelInfo, Ops, UOp
  cmd = _c_compilers()[compiler]
  monkeypatch.setenv("CC", " ".join(cmd))
  monkeypatch.setenv("CACHELEVEL", "0")
  r = ClangRenderer()
  assert r.compiler.cmd == cmd and r.compiler.is_clang == (compiler != "gcc")
  assert r.half_type == ("_Float16" if compiler == "gcc" else "__fp16")
  dev = Device["CPU"]
  for dt in (dtypes.float32, dtypes.float16, dtypes.int32):
    n = 37
    c, a = UOp(Ops.PARAM, dt.ptr(n), arg=0), UOp(Ops.PARAM, dt.ptr(n), arg=1)
    i = UOp.range(n, 0)
    ast = c.index(i).store(a.index(i).load() * UOp.const(dt, 3) + UOp.const(dt, 1)).sink(
      arg=KernelInfo(f"cc_{compiler.replace(' ', '_')}_{dt.name.replace(' ', '_')}"))
    spec = get_program(ast, r)
    npdt = {dtypes.float32: np.float32, dtypes.float16: np.float16, dtypes.int32: np.int32}[dt]
    x = np.arange(n).astype(npdt)
    out, inp = Buffer("CPU", n, dt).allocate(), Buffer("CPU", n, dt, initial_value=x.tobytes())
    dev.get_program(spec.name, spec.lib)(out._buf, inp._buf, global_size=spec.global_size, vals=(), wait=True)
    np.testing.assert_array_equal(np.frombuffer(out.as_buffer(), npdt), x * npdt(3) + npdt(1))


def test_pool_after_fork():
  """A forked child (multiprocessing with fork) gets a working pool of its own."""
  import multiprocessing as mp
  from tiny_runtime_cpu.threads import ThreadPool
  pool = ThreadPool(2)
  pool.run(lambda i: None, 4)  # threads started in the parent
  ctx = mp.get_context("fork")
  q = ctx.Queue()

  def child():
    seen = []
    pool.run(seen.append, 16)
    q.put(sorted(seen) == list(range(16)) and len(pool.threads) == 2)
  p = ctx.Process(target=child)
  p.start()
  p.join(30)
  assert p.exitcode == 0 and q.get(timeout=5) is True
  pool.close()
