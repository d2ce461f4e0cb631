"""The CPU thread pool and threaded kernels: kernels tiny-codegen splits over `core_id` shares give numpy's results
for every share count, including uneven last shares; the pool runs each share of each launch exactly once under
concurrent launches from many Python threads, reports errors to the launching thread only, and its helpers use
(almost) no CPU while idle."""
import ctypes
import functools
import threading
import time
from typing import Any

import numpy as np
import pytest

from tiny_uop import AxisType, KernelInfo, Ops, UOp
from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import Device
from tiny_runtime_cpu.threads import ThreadPool

SENTINEL = -7.0


def _add(n: int, name: str) -> UOp:
  out, a, b = (UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(3))
  r = UOp.range(n, 0)
  return out.index(r).store(a.index(r).load() * 3.0 + b.index(r).load()).sink(arg=KernelInfo(name))


def _row_sums(rows: int, cols: int, name: str) -> UOp:
  out, x = UOp(Ops.PARAM, dtypes.float32.ptr(rows), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(rows * cols), arg=1)
  r, c = UOp.range(rows, 0), UOp.range(cols, 1, AxisType.REDUCE)
  return out.index(r).store(x.index(r * cols + c).load().reduce(c, arg=Ops.ADD)).sink(arg=KernelInfo(name))


def _run(ast: UOp, threads: int, arrays: list[np.ndarray], out_n: int) -> tuple[np.ndarray, int]:
  """Compile `ast` split over `threads` shares (no minimum work), run it; the output buffer holds `out_n` elements
  followed by 8 sentinels, which must survive (no share writes past its end). Returns (output, shares)."""
  from tiny_codegen import get_program
  dev = Device["CPU:LLVM"]
  ren = type(dev.renderer)()
  ren.threads, ren.thread_min_work = threads, 0
  spec = get_program(ast, ren)
  prg = dev.get_program(spec.name, spec.lib)
  out = Buffer("CPU", out_n + 8, dtypes.float32, initial_value=np.full(out_n + 8, SENTINEL, np.float32).tobytes())
  bufs = [out, *(Buffer("CPU", a.size, dtypes.float32, initial_value=a.tobytes()) for a in arrays)]
  prg(*[bufs[s].ensure_allocated()._buf for s in spec.globals], global_size=spec.global_size, wait=True)
  got = np.frombuffer(out.as_buffer(), np.float32).copy()
  assert (got[out_n:] == SENTINEL).all(), f"a share wrote past element {out_n}"
  return got[:out_n], spec.global_size[0]


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("n", [1, 7, 10, 1000, 4099])
def test_threaded_add_matches_numpy(threads: int, n: int) -> None:
  rng = np.random.default_rng(n * 10 + threads)
  a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  got, shares = _run(_add(n, f"thr_add_{n}_{threads}"), threads, [a, b], n)
  np.testing.assert_array_equal(got, a * np.float32(3.0) + b)
  chunk = -(-n // min(threads, n))
  assert shares == -(-n // chunk)  # n=10 on 3: shares of 4, 4, 2; on 5: 2 each; n=7 on 5: 2, 2, 2, 1 (none empty)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("rows,cols", [(3, 1000), (7, 33), (64, 257)])
def test_threaded_row_sums_match_numpy(threads: int, rows: int, cols: int) -> None:
  x = np.random.default_rng(rows).standard_normal(rows * cols).astype(np.float32)
  got, shares = _run(_row_sums(rows, cols, f"thr_rows_{rows}_{cols}_{threads}"), threads, [x], rows)
  np.testing.assert_allclose(got, x.reshape(rows, cols).astype(np.float64).sum(1), rtol=1e-4, atol=1e-4)
  assert shares > 1  # the row loop (or an axis the optimizer left outermost) was split


@pytest.mark.parametrize("workers", [1, 3])
def test_concurrent_launches_from_python_threads(workers: int) -> None:
  """8 Python threads x 150 launches of 1..9 shares on one pool: every launch runs each of its shares exactly once,
  and a launch whose share raises reports it to its own thread only."""
  pool = ThreadPool(workers)
  problems: list[str] = []

  def launcher(seed: int) -> None:
    for k in range(150):
      n = 1 + (seed + k) % 9
      seen: list[int] = []
      lock = threading.Lock()

      def share(i: int, seen: list[int] = seen, lock: threading.Lock = lock, k: int = k, n: int = n) -> None:
        with lock: seen.append(i)
        if k % 50 == 7 and i == n - 1: raise ValueError(f"launcher {seed} launch {k}")
      try: pool.run(share, n)
      except ValueError as e:
        if str(e) != f"launcher {seed} launch {k}" or k % 50 != 7: problems.append(f"stray error {e}")
      else:
        if k % 50 == 7: problems.append(f"launcher {seed} launch {k}: error lost")
      if sorted(seen) != list(range(n)): problems.append(f"launcher {seed} launch {k}: shares {sorted(seen)}")
  ts = [threading.Thread(target=launcher, args=(s,)) for s in range(8)]
  for t in ts: t.start()
  for t in ts: t.join(60)
  assert not any(t.is_alive() for t in ts) and problems == []
  assert len(pool.threads) == workers
  pool.close()


def test_idle_pool_burns_no_cpu_and_close_ends_its_threads() -> None:
  """After a burst of launches the helpers poll for at most `spin_s`, then sleep: over 0.2 s of idleness the process
  uses under 5% of one core (measured ~0.02%; helpers left polling for seconds measured 12% on a loaded machine,
  where each poll's `sleep(0)` yields for ~50-200 µs). `close` ends the helper threads."""
  before = set(threading.enumerate())
  pool = ThreadPool(2)
  for _ in range(300): pool.run(lambda i: None, 3)
  new = set(threading.enumerate()) - before
  assert new == set(pool.threads) and len(new) == 2  # helpers are reused, not started per launch
  time.sleep(0.05)  # far longer than spin_s (50 µs)
  c0, w0 = time.process_time(), time.perf_counter()
  time.sleep(0.2)
  cpu, wall = time.process_time() - c0, time.perf_counter() - w0
  assert cpu / wall < 0.05, f"idle pool used {cpu / wall:.0%} of a core"
  threads = list(pool.threads)
  pool.close()
  for t in threads: t.join(5)
  assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("spin_s", [0.0, 50e-6, 0.5])
def test_close_right_after_a_launch_ends_every_helper(spin_s: float) -> None:
  """`close` while helpers still poll after a launch (spin_s 0.5 s: surely polling) or already block: each helper
  takes its stop marker either way and ends."""
  pool = ThreadPool(3)
  pool.spin_s = spin_s
  seen: list[int] = []
  pool.run(seen.append, 4)
  threads = list(pool.threads)
  pool.close()
  for t in threads: t.join(5)
  assert sorted(seen) == [0, 1, 2, 3] and not any(t.is_alive() for t in threads)


# ***** native dispatch (native_pool): shares claimed and run without the GIL *****
def _native_kernel(dev) -> tuple[int, int]:
  """(address, trampoline) of an LLVM kernel `out[core_id] = v * 1000 + core_id + 0.5` (one buffer, one int32
  value): each share writes its own slot, so a share run twice or never shows."""
  from tiny_codegen.compiler.llvm import LLVMCompiler
  ir = """define void @native_probe(ptr noalias %out, i32 %v, i32 %core) nounwind {
entry:
  %a = mul i32 %v, 1000
  %b = add i32 %a, %core
  %f = sitofp i32 %b to float
  %g = fadd float %f, 5.000000e-01
  %p = getelementptr float, ptr %out, i32 %core
  %old = load float, ptr %p
  %h = fadd float %old, %g
  store float %h, ptr %p
  ret void
}
"""
  prg = dev.get_program("native_probe", LLVMCompiler().compile_cached(ir))
  dev.pool.run(lambda i: None, 2)  # starts the helpers, and with them native dispatch
  assert dev.pool.native is not None and dev.pool.native_iters > 0
  return prg.addr, dev.pool.native.tramp(1, 1)


@pytest.mark.parametrize("n", [2, 3, 17, 64])
def test_native_launch_runs_every_share_once(n: int) -> None:
  dev = Device["CPU"]
  addr, tramp = _native_kernel(dev)
  out = np.zeros(n, np.float32)
  for v in (7, -3):  # the int32 value reaches the kernel, negative too
    out[:] = 0
    assert dev.pool.run_native(tramp, addr, dev.pool.native.args([out.ctypes.data, v]), n)
    np.testing.assert_array_equal(out, v * 1000 + np.arange(n) + 0.5)


def test_native_launches_from_python_threads() -> None:
  """8 Python threads x 60 launches: one native launch runs at a time, the others take the queue path (both run each
  share exactly once); a helper that blocked is woken for later launches."""
  dev = Device["CPU"]
  addr, tramp = _native_kernel(dev)
  pool, errors, native_runs = dev.pool, [], [0]

  def worker(t: int) -> None:
    try:
      for it in range(60):
        n = 2 + (t + it) % 9
        out = np.zeros(n, np.float32)
        args = pool.native.args([out.ctypes.data, t * 10 + it % 10])
        if pool.run_native(tramp, addr, args, n): native_runs[0] += 1
        else: pool.run(functools.partial(ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(addr),
                                         out.ctypes.data, t * 10 + it % 10), n)
        if not np.array_equal(out, (t * 10 + it % 10) * 1000 + np.arange(n) + 0.5): errors.append((t, it, out))
        if it % 20 == 19: time.sleep(0.003)  # long enough for the helpers to block: later launches must wake them
    except BaseException as e:  # noqa: BLE001 -- reported below
      errors.append(e)
  ts = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
  for t in ts: t.start()
  for t in ts: t.join(60)
  assert not errors, errors[:3]
  assert native_runs[0] > 0 and not any(t.is_alive() for t in ts), (native_runs, [t.is_alive() for t in ts])


def test_native_helpers_block_when_idle_and_close_ends_them() -> None:
  """After `native_spin_s` without a launch the helpers block (no CPU burnt); a launch then still gets them, and
  `close` ends them."""
  from tiny_runtime_cpu.cpu import CPUDevice
  dev = CPUDevice("CPU")
  addr, tramp = _native_kernel(dev)
  pool = dev.pool
  time.sleep(0.05)  # far past native_spin_s (1 ms)
  assert all(pool.asleep) and len(pool.asleep) == pool.workers
  c0, w0 = time.process_time(), time.perf_counter()
  time.sleep(0.2)
  assert (time.process_time() - c0) / (time.perf_counter() - w0) < 0.05
  out = np.zeros(16, np.float32)
  assert pool.run_native(tramp, addr, pool.native.args([out.ctypes.data, 1]), 16)
  np.testing.assert_array_equal(out, 1000 + np.arange(16) + 0.5)
  threads = list(pool.threads)
  dev.finalize()
  for t in threads: t.join(5)
  assert not any(t.is_alive() for t in threads)


def test_close_while_helpers_poll_natively() -> None:
  """`close` (as at exit) while the helpers still poll natively after a launch: each one stops cleanly when its
  poll ends, with no error in the thread (it once indexed the pool's new, empty list of sleeping helpers)."""
  from tiny_runtime_cpu.cpu import CPUDevice
  errors: list[Any] = []
  # set here, not by monkeypatch: pytest installs its own hook for the test's call, over a fixture's
  hook, threading.excepthook = threading.excepthook, lambda a: errors.append(a.exc_value)
  try: _close_while_polling(CPUDevice("CPU"))
  finally: threading.excepthook = hook
  assert not errors, errors


def _close_while_polling(dev: Any) -> None:
  addr, tramp = _native_kernel(dev)
  pool = dev.pool
  pool.native_iters *= 100  # the helpers poll ~100 ms after a launch: close() comes while they do
  until = time.perf_counter() + 5  # they read the count when they start polling: after they block, a launch wakes them
  while not (pool.asleep and all(pool.asleep)) and time.perf_counter() < until: time.sleep(1e-3)
  out = np.zeros(4, np.float32)
  assert pool.run_native(tramp, addr, pool.native.args([out.ctypes.data, 2]), 4)
  np.testing.assert_array_equal(out, 2000 + np.arange(4) + 0.5)
  threads, until = list(pool.threads), time.perf_counter() + 5
  while any(pool.asleep) and time.perf_counter() < until: time.sleep(1e-3)  # a helper that was blocked wakes to poll
  assert threads and not any(pool.asleep)
  time.sleep(0.01)  # well inside its poll now
  pool.close()
  st = time.perf_counter()
  for t in threads: t.join(10)
  assert not any(t.is_alive() for t in threads)
  assert time.perf_counter() - st > 0.02, "the helpers had stopped polling before close(): nothing was tested"


def test_native_helper_stays_native_across_back_to_back_launches() -> None:
  """A helper that ran a launch's shares polls on, in native code, for the next launch: it returns to Python (whose
  GIL a replay driven from Python holds between its launches) only after `iters` polls without a new one. It
  returned after every launch, and so joined the next one late or not at all: the 2048x768 Q4_K matvec of the LLM
  decode ran no faster on two threads than on one (issue #39)."""
  from tiny_runtime_cpu.cpu import CPUDevice
  from tiny_runtime_cpu.native_pool import NativePool
  dev = CPUDevice("CPU")
  addr, tramp = _native_kernel(dev)
  native = NativePool(dev.native_load, dev.native_triple)  # a block of its own: no pool helper polls it
  iters = dev.pool.native_iters * int(0.5 / dev.pool.native_spin_s)  # ~0.5 s, in the pool's unit (ticks or polls)
  got: list[int] = []
  helper = threading.Thread(target=lambda: got.append(native.helper(native.state_addr, 0, iters)))
  helper.start()
  outs = [np.zeros(64, np.float32) for _ in range(2)]
  native.main(native.state_addr, 1, 64, tramp, addr, ctypes.addressof(args1 := native.args([outs[0].ctypes.data, 1])))
  time.sleep(0.05)  # the helper has seen launch 1 by now (it polls the published generation)
  still_polling = helper.is_alive()
  native.main(native.state_addr, 2, 64, tramp, addr, ctypes.addressof(args2 := native.args([outs[1].ctypes.data, 2])))
  helper.join(30)
  del args1, args2
  for v, out in enumerate(outs, 1): np.testing.assert_array_equal(out, v * 1000 + np.arange(64) + 0.5)
  assert still_polling, f"the helper returned to Python after launch 1 (returned {got})"
  assert got == [2], f"the helper's last launch seen: {got}, expected 2"


@pytest.mark.parametrize("nbufs,nvals", [(1, 0), (3, 2), (9, 4), (2, 7)])
def test_native_trampoline_calls_with_the_exact_prototype(nbufs: int, nvals: int) -> None:
  """`tiny_call_<B>_<V>` passes B pointers and V int32 values (more than fit in registers too) and core_id."""
  from tiny_codegen.compiler.llvm import LLVMCompiler
  from tiny_runtime_cpu.native_pool import call_ir
  dev = Device["CPU"]
  params = [f"ptr %b{i}" for i in range(nbufs)] + [f"i32 %v{i}" for i in range(nvals)] + ["i32 %core"]
  # buffer i's element core_id gets (i + 1) * 10000 + the values' sum + core_id: each pointer lands in its slot
  body = ["  %s0 = add i32 0, %core"] + [f"  %s{i + 1} = add i32 %s{i}, %v{i}" for i in range(nvals)]
  for i in range(nbufs):
    body += [f"  %t{i} = add i32 %s{nvals}, {(i + 1) * 10000}", f"  %f{i} = sitofp i32 %t{i} to float",
             f"  %p{i} = getelementptr float, ptr %b{i}, i32 %core", f"  store float %f{i}, ptr %p{i}"]
  ir = f"define void @proto_{nbufs}_{nvals}({', '.join(params)}) nounwind {{\nentry:\n" + "\n".join(body) + \
    "\n  ret void\n}\n"
  comp = LLVMCompiler()
  kern = dev.get_program(f"proto_{nbufs}_{nvals}", comp.compile_cached(ir))
  tramp = dev.get_program(f"tiny_call_{nbufs}_{nvals}", comp.compile_cached(call_ir(nbufs, nvals)))
  bufs = [np.zeros(8, np.float32) for _ in range(nbufs)]
  vals = [(-1) ** i * (i + 1) * 100 for i in range(nvals)]
  block = (ctypes.c_int64 * max(1, nbufs + nvals))(*[b.ctypes.data for b in bufs], *vals)
  call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(tramp.addr)
  for core in (0, 5): call(kern.addr, ctypes.addressof(block), core)
  for i, b in enumerate(bufs):
    base = (i + 1) * 10000 + sum(vals)
    assert b[0] == base and b[5] == base + 5 and b[1] == 0, (i, b)


def test_native_launch_gets_a_helper_whose_poll_ended_while_the_gil_was_held() -> None:
  """A helper whose native poll ends while the launching thread holds the GIL waits for the GIL, then blocks on the
  queue; a launch made meanwhile counted it awake and put no token for it, so it slept through that launch (a whole
  LLM prefill replay ran on one thread of two: issue #39). The launch here has two shares that wait for each other:
  share 0 polls for share 1's flag (~1e9 polls at most) and writes whether it came, so it comes only when another
  thread runs share 1 at the same time."""
  import sys
  from tiny_codegen.compiler.llvm import LLVMCompiler
  from tiny_runtime_cpu.cpu import CPUDevice
  ir = """define void @rendezvous(ptr noalias %flags, i32 %limit, i32 %core) nounwind {
entry:
  %p1 = getelementptr i32, ptr %flags, i32 1
  %first = icmp eq i32 %core, 0
  br i1 %first, label %wait, label %signal
signal:
  store atomic i32 1, ptr %p1 release, align 4
  ret void
wait:
  %i = phi i32 [ 0, %entry ], [ %inext, %spin ]
  %f = load atomic i32, ptr %p1 acquire, align 4
  %got = icmp ne i32 %f, 0
  br i1 %got, label %done, label %spin
spin:
  %inext = add i32 %i, 1
  %more = icmp slt i32 %inext, %limit
  br i1 %more, label %wait, label %done
done:
  %seen = phi i32 [ 1, %wait ], [ 0, %spin ]
  store i32 %seen, ptr %flags, align 4
  ret void
}
"""
  dev = CPUDevice("CPU")
  pool = dev.pool
  if pool.workers < 1: pytest.skip("one thread: no helper to hand a share to")
  addr = dev.get_program("rendezvous", LLVMCompiler().compile_cached(ir)).addr
  _native_kernel(dev)  # starts the helpers and native dispatch
  tramp = pool.native.tramp(1, 1)
  interval = sys.getswitchinterval()
  try:
    for _ in range(3):
      flags = np.zeros(2, np.int32)
      until = time.perf_counter() + 5
      while any(pool.asleep) and time.perf_counter() < until:  # wake the helpers: they poll natively now
        assert pool.run_native(tramp, addr, pool.native.args([np.zeros(2, np.int32).ctypes.data, 0]), 2)
      assert not any(pool.asleep)
      sys.setswitchinterval(10.0)  # this thread keeps the GIL while it runs Python
      st = time.perf_counter()
      while time.perf_counter() - st < 20 * pool.native_spin_s: pass  # the helpers' polls end meanwhile
      assert pool.run_native(tramp, addr, pool.native.args([flags.ctypes.data, 1 << 30]), 2)
      sys.setswitchinterval(interval)
      assert flags[1] == 1 and flags[0] == 1, f"share 0 ran without share 1 beside it: {flags}"
  finally:
    sys.setswitchinterval(interval)
    dev.finalize()


def test_python_launch_of_a_cheap_split_kernel_runs_inline(monkeypatch: pytest.MonkeyPatch) -> None:
  """A split kernel launched through the Python path (`CPUProgram.__call__`) whose cost (`spec.cost`, handed to
  `get_program`) is below `CPUProgram.python_min_work` runs its shares on the launching thread in one native call
  (`inline_launches` counts it; no helper runs a share of it); at or above that minimum, or with its cost unknown, it
  goes to the pool. Numbers equal numpy's either way, and no share writes past the output."""
  from tiny_codegen import get_program
  from tiny_runtime_cpu.cpu import CPUProgram
  dev = Device["CPU:LLVM"]
  ren = type(dev.renderer)()
  ren.threads, ren.thread_min_work = 3, 0
  n = 1001
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  for case in ("inline", "pool", "unknown"):
    spec = get_program(_add(n, f"inline_{case}"), ren)
    assert spec.global_size == (3, 1, 1) and 0 < spec.cost < CPUProgram.python_min_work
    if case == "pool": monkeypatch.setattr(CPUProgram, "python_min_work", spec.cost)
    prg = dev.get_program(spec.name, spec.lib, **({} if case == "unknown" else {"cost": spec.cost}))
    assert prg.cost == (0 if case == "unknown" else spec.cost)
    out = Buffer("CPU", n + 8, dtypes.float32, initial_value=np.full(n + 8, SENTINEL, np.float32).tobytes())
    bufs = [out, *(Buffer("CPU", x.size, dtypes.float32, initial_value=x.tobytes()) for x in (a, b))]
    inline, helped = CPUProgram.inline_launches, dev.pool.native.helper_shares if dev.pool.native else 0
    prg(*[bufs[s].ensure_allocated()._buf for s in spec.globals], global_size=spec.global_size)
    assert CPUProgram.inline_launches == inline + (case == "inline"), case
    if case == "inline": assert (dev.pool.native.helper_shares if dev.pool.native else 0) == helped
    got = np.frombuffer(out.as_buffer(), np.float32)
    np.testing.assert_allclose(got[:n], a * np.float32(3) + b, rtol=1e-6)
    assert (got[n:] == SENTINEL).all()
    monkeypatch.undo()
  again = get_program(_add(n, "inline_unknown"), ren)  # told later: the loaded program learns its cost
  assert dev.get_program(again.name, again.lib, cost=again.cost).cost == again.cost


def _blocking_pool() -> Any:
  """A fresh CPU device whose pool has a helper and whose launcher blocks after its spin (skips where it can't)."""
  from tiny_runtime_cpu.cpu import CPUDevice
  from tiny_runtime_cpu.native_pool import blocks
  dev = CPUDevice("CPU")
  if dev.pool.workers < 1: pytest.skip("one thread: no helper to hand a share to")
  if not blocks(dev.native_triple): pytest.skip(f"{dev.native_triple}: the launcher only spins (no futex)")
  _native_kernel(dev)  # starts the helpers and native dispatch
  return dev


def test_launcher_blocks_while_a_helper_is_held_off_and_the_launch_completes() -> None:
  """A launch whose helper share is held in Python (it sleeps 60 ms: as a helper the OS descheduled) while the
  launcher's own share takes 2 ms (time for a woken helper to claim the other): the launcher spins twice its share's
  time, then blocks (futex) until the helper ends the last share and wakes it; every share ran once, with its own
  `core_id`."""
  dev = _blocking_pool()
  pool, launcher = dev.pool, threading.get_ident()
  try:
    ran: list[tuple[int, bool]] = []

    def share(out: int, v: int, core: int) -> None:
      helper = threading.get_ident() != launcher
      time.sleep(0.06 if helper else 0.002)
      ran.append((core, helper))
      ctypes.c_float.from_address(out + 4 * core).value = v * 1000 + core + 0.5
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(share)
    addr, tramp = ctypes.cast(fn, ctypes.c_void_p).value, pool.native.tramp(1, 1)
    helped = 0
    for it in range(50):  # until the helper took a share (it polls natively after the first launch)
      ran.clear()
      out, blocked = np.zeros(2, np.float32), pool.native.launcher_blocks
      assert pool.run_native(tramp, addr, pool.native.args([out.ctypes.data, it]), 2)
      np.testing.assert_array_equal(out, it * 1000 + np.arange(2) + 0.5)
      assert sorted(c for c, _ in ran) == [0, 1]
      if any(h for _, h in ran):
        helped += 1
        assert pool.native.launcher_blocks > blocked, "the launcher spun through the helper's 60 ms share"
        if helped == 3: break
    assert helped == 3, "the helper never took a share"
  finally: dev.finalize()


def test_launcher_wakeups_are_never_lost() -> None:
  """300 launches of 2 shares (Python callbacks) that meet: share 0 waits for share 1 to start, so two threads run
  them; share 1 then runs a time drawn at random (0-3 ms) while share 0 returns at once. Where the launcher ran
  share 0, its spin budget is twice the time it waited for the helper, so the helper's share ends before, around and
  after the launcher stops spinning and blocks. The launcher's wait ends every time (a lost wake-up would block it
  for good: the launches run in a thread given 120 s), each share runs once, and some waits ended blocked."""
  dev = _blocking_pool()
  pool, rng = dev.pool, np.random.default_rng(0)
  try:
    started, ran, bad, blocked = threading.Event(), [0, 0], [], pool.native.launcher_blocks
    delays = rng.uniform(0, 3e-3, 300)

    def share(out: int, it: int, core: int) -> None:
      if core == 1:
        started.set()
        time.sleep(float(delays[it]))
      elif not started.wait(5): bad.append(("share 1 never started", it))
      ran[core] += 1
      ctypes.c_int32.from_address(out + 4 * core).value += 1
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(share)
    addr, tramp = ctypes.cast(fn, ctypes.c_void_p).value, pool.native.tramp(1, 1)

    def launches() -> None:
      for it in range(len(delays)):
        started.clear()
        out = np.zeros(2, np.int32)
        if not pool.run_native(tramp, addr, pool.native.args([out.ctypes.data, it]), 2): bad.append(it)
        elif not (out == 1).all(): bad.append((it, out))
    t = threading.Thread(target=launches, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "a launcher's wait never ended (a lost wake-up)"
    assert not bad and ran == [len(delays)] * 2, (bad[:3], ran)
    assert pool.native.launcher_blocks > blocked, "no launch blocked: the wake-up path was not tested"
  finally: dev.finalize()


@pytest.mark.parametrize("triple", ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu",
                                    "riscv64-unknown-linux-gnu", "x86_64-apple-darwin", "aarch64-apple-darwin"])
def test_pool_ir_of_every_target_is_valid(triple: str) -> None:
  """The dispatch code is valid LLVM IR for every target; it blocks and yields (futex, sched_yield syscalls, rdtsc
  timing) on x86-64 Linux only, and there it compiles to three syscalls (wait, wake, yield); elsewhere it spins."""
  import llvmlite.binding as llvm
  from tiny_runtime_cpu.native_pool import blocks, pool_ir
  mod = llvm.parse_assembly(pool_ir(triple))
  mod.verify()
  assert blocks(triple) == (triple == "x86_64-unknown-linux-gnu")
  if blocks(triple):
    llvm.initialize_native_asmparser()  # the inline assembly is parsed when the object is emitted
    asm = llvm.Target.from_triple(triple).create_target_machine().emit_assembly(mod)
    assert asm.count("syscall") == 3 and "rdtsc" in asm
  else: assert "asm sideeffect" not in pool_ir(triple) and "readcyclecounter" not in pool_ir(triple)


def test_launch_closes_next_before_writing_its_fields() -> None:
  """`tiny_pool_main` stores the new generation's closed `next` (index 2**32-1) and a full fence before any of the
  launch's fields (share count, trampoline, kernel, arguments): a helper that read the ended launch's `next` and then
  the new share count must fail its compare-and-swap, not claim a share past the ended launch's last one and run it
  with the new launch's kernel and a mix of both launches' arguments."""
  from tiny_runtime_cpu.native_pool import pool_ir
  body = pool_ir("x86_64-unknown-linux-gnu").split("define void @tiny_pool_main")[1].split("\n}")[0]
  lines = [ln.strip() for ln in body.splitlines()]
  stores = [i for i, ln in enumerate(lines) if ln.startswith("store")]
  close, fence = stores[0], lines.index("fence seq_cst")
  assert "ptr %pnext seq_cst" in lines[close] and "%closed" in lines[close], lines[close]
  assert "%closed = or i64 %first, 4294967295" in lines
  fields = [i for i in stores if any(f"ptr %{w} " in lines[i] for w in ("pn", "ptramp", "pfn", "pargs"))]
  assert len(fields) == 4 and close < fence < min(fields), (close, fence, fields)


def test_back_to_back_native_launches_of_two_kernels_run_each_share_once() -> None:
  """4000 native launches alternating between 2 and 17 shares of a kernel that adds into its own slot: a share run
  twice, or run with the other launch's share count or arguments, shows in the sums. (The race the test above pins
  needs the launcher preempted within a few instructions, which this rarely provokes: it guards the common path.)"""
  dev = Device["CPU"]
  addr, tramp = _native_kernel(dev)
  outs = {n: np.zeros(n, np.float32) for n in (2, 17)}
  vals = {2: 1, 17: 2}  # sums stay multiples of 0.5 under 2**23: exact in float32
  args = {n: dev.pool.native.args([outs[n].ctypes.data, vals[n]]) for n in (2, 17)}
  for _ in range(2000):
    for n in (2, 17): assert dev.pool.run_native(tramp, addr, args[n], n)
  for n in (2, 17): np.testing.assert_array_equal(outs[n], 2000 * (vals[n] * 1000 + np.arange(n) + 0.5))
