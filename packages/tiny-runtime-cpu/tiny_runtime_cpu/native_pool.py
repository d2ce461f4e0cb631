"""Native share dispatch for the CPU thread pool: launches whose shares the threads claim and run without the GIL.

The Python pool (`threads.ThreadPool`) hands a launch to its helpers through a queue: a helper that sleeps on the
queue, or on the GIL it needs to claim a share, is woken by the OS, and on a VM whose idle vCPU halts that took a
median 58 µs (p90 96 µs) in the convnet training step's replay, where the launching thread ran its share alone
meanwhile. Here a launch is published in a small shared block and claimed by native code:

- `tiny_pool_main(state, gen, n, tramp, fn, args)` (the launching thread, through ctypes, so without the GIL):
  publishes launch `gen` of `n` shares, runs shares until none are left, then waits for the helpers' shares to end:
  it spins (the CPU's spin-wait hint) for twice the time one of its own shares took (timed with the CPU's tick
  counter, x86 `rdtsc`), then blocks in the kernel (Linux `futex` on word 8, a direct syscall)
  until the helper that ends the last share wakes it. A helper still running is done within about a share's time;
  one that is not came late because the OS took its CPU (another process, the host): spinning on would hold the
  launcher's core for a whole scheduler tick while the helper waits for a core, where blocking gives that core up
  so the OS can run the helper there. Elsewhere (not x86-64 Linux) it spins until the shares end.
- `tiny_pool_helper(state, last, iters)` (a helper thread, through ctypes): polls the block for a launch other than
  the last one it saw (at first `last`), runs shares of it while there are any, and polls on for the next one; after
  `iters` polls (where it yields, see below: `iters` ticks of the tick counter, `tiny_pool_ticks()`, since it
  started or joined a launch) with no new launch it returns the last generation it saw (`last` when none came): the
  helper then blocks in Python until woken. It stays in native code across back-to-back launches: returning to
  Python after each one (as it did) made it wait for the GIL, which the launching thread holds between the launches
  of a replay made from Python, so it joined each launch late (an OS wake-up on a VM: 50-100 µs) or not at all.
  After a launch it polls hot (the spin-wait hint only) for as long as its own last share took (the launcher is
  then likely still in its share of that launch; the next launch comes after it), and from then on each poll also
  yields its core (`sched_yield`) to any thread that wants it: on a machine with every core busy a helper that only
  spun took CPU time from the launching thread of its own replay (mobilenet_v3_small's jit call at load ~4 plus one
  spinning process on the 2-vCPU Zen 4: ~3 ms of the helper's polls a call, median 10-23 ms against 7-15 ms on one
  thread).
  Where the core is free the yield returns at once.
- `tiny_call_<B>_<V>(fn, args, core_id)`: calls a kernel of B buffers and V int32 values (`args`: B addresses then V
  values, one int64 each) with its exact prototype (docs/PIPELINE.md §4), so no ABI is assumed.

A share is claimed by a compare-and-swap of `next` = generation << 32 | index, so a helper still looking at an
ended launch can never claim a share of the next one. The launcher first closes `next` (the new generation with
index 2**32-1, then a full fence) and only then writes the launch's fields: a helper that read the ended launch's
`next` and then the new launch's share count fails its compare-and-swap, where (with the fields written first) it
could claim a share past the ended launch's last one and run it with the new launch's kernel and a mix of the two
launches' arguments (a crash in a kernel, seen under load), and count it as one of the new launch's shares.
The block's words: 0 the published generation, 1 `next`, 2 shares finished, 3 shares in all, 4 trampoline, 5 kernel,
6 arguments, 7 shares the helpers ran (a count that only grows: `NativePool.helper_shares`, how often a second
thread took part, for tests and benches), 8 the launcher's wait word (its low 32 bits: 1 while the launcher may
block on it), 9 the launcher's blocking waits (a count that only grows: `NativePool.launcher_blocks`). Polls use the
CPU's spin-wait hint (x86 `pause`, Arm `yield`).

No wake-up is lost: the launcher stores 1 in the wait word, then reads `finished` again and blocks only if shares
are left, and only while the word is still 1 (the futex compares it atomically); the thread that ends the last share
adds to `finished`, then reads the wait word (all four sequentially consistent, so at least one of the two reads
sees the other's write) and, seeing 1, swaps in 0 and wakes the launcher. A helper of an earlier launch that reads
the word late may clear it or wake the launcher early: the launcher then finds shares left and waits again.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

WORDS = 10
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129  # linux/futex.h: FUTEX_WAIT|WAKE | FUTEX_PRIVATE_FLAG


def _hint(triple: str) -> tuple[str, str]:
  """(call, declaration) of the spin-wait hint for `triple`'s CPU; none on others."""
  arch = triple.split("-")[0]
  if arch == "x86_64": return "call void @llvm.x86.sse2.pause()", "declare void @llvm.x86.sse2.pause()"
  if arch == "aarch64": return "call void @llvm.aarch64.hint(i32 1)", "declare void @llvm.aarch64.hint(i32)"
  return "", ""


def _ticks(triple: str, name: str) -> tuple[str, str]:
  """(instruction setting `%name` to the CPU's tick counter, declaration) for `triple`: x86's `rdtsc` (constant rate
  on every x86-64 CPU with an invariant TSC, which Linux requires to use it as its clock); None elsewhere."""
  if triple.split("-")[0] != "x86_64": return "", ""
  return f"%{name} = call i64 @llvm.readcyclecounter()", "declare i64 @llvm.readcyclecounter()"


def _syscall(triple: str, name: str, nr: int, args: str = "") -> str:
  """The x86-64 Linux syscall `nr` of up to 4 `args` (LLVM typed values, comma-separated) as inline assembly, its
  result in `%name`; "" for other targets (Arm's `svc` form and `cntvct_el0` counter would do there, but this
  project's llvmlite has no Arm assembly parser to check them with, so Arm spins as before)."""
  if triple.split("-")[0] != "x86_64" or "linux" not in triple: return ""
  n = len([x for x in args.split(",") if x.strip()])
  regs = ",".join(["{rax}", *("{rdi}", "{rsi}", "{rdx}", "{r10}")[:n]])
  return (f'%{name} = call i64 asm sideeffect "syscall", "={{rax}},{regs},~{{rcx}},~{{r11}},~{{memory}}"'
          f'(i64 {nr}{", " + args if n else ""})')


def _futex(triple: str, name: str, op: int, val: int) -> str:
  """`futex(word 8, op, val, NULL)` (see `_syscall`)."""
  return _syscall(triple, name, 202, f"ptr %pwait, i64 {op}, i64 {val}, i64 0")


def _yield(triple: str, name: str) -> str:
  """`sched_yield()` (see `_syscall`)."""
  return _syscall(triple, name, 24)


def blocks(triple: str) -> bool:
  """Whether `tiny_pool_main` compiled for `triple` blocks (futex) after its bounded spin and the helpers' polls
  yield (`sched_yield`) after theirs, or both only spin."""
  return bool(_futex(triple, "r", 0, 0) and _ticks(triple, "t")[0])


def _spin(hint: str) -> str:
  """The launcher's wait loop: `wait` goes to `out` once every share of the launch ended, else to `pause`, which
  runs the spin-wait `hint` and falls through to what the caller appends."""
  return f"""wait:
  %done = load atomic i64, ptr %pfin acquire, align 8
  %all = icmp uge i64 %done, %n
  br i1 %all, label %out, label %pause
pause:
  {hint}"""


_FIELDS = "".join(f"  %{name} = getelementptr i64, ptr %st, i64 {i}\n"
                  for i, name in enumerate(("pnext", "pfin", "pn", "ptramp", "pfn", "pargs", "phelped", "pwait",
                                            "pblocks"), start=1))
"""Pointers to the block's words 1-9 (see the module docstring), as the functions that use them name them."""


def pool_ir(triple: str) -> str:
  """LLVM IR of `tiny_pool_main` and `tiny_pool_helper` (see the module docstring)."""
  call, decl = _hint(triple)
  (t0, tdecl), (t1, _), (tnow, _) = _ticks(triple, "t0"), _ticks(triple, "t1"), _ticks(triple, "now")
  if blocks(triple):
    # the thread that ends a launch's last share wakes a launcher that blocked (or is about to)
    wake = f"""  %fin = add i64 %old, 1
  %last = icmp eq i64 %fin, %n
  br i1 %last, label %lastshare, label %counted
lastshare:
  %w = load atomic i32, ptr %pwait seq_cst, align 8
  %waits = icmp ne i32 %w, 0
  br i1 %waits, label %take, label %counted
take:
  %was = atomicrmw xchg ptr %pwait, i32 0 seq_cst, align 8
  %had = icmp ne i32 %was, 0
  br i1 %had, label %wake, label %counted
wake:
  {_futex(triple, "woke", FUTEX_WAKE_PRIVATE, 1)}
  br label %counted"""
    # spin for twice the launcher's own share time, then block until the last share's thread wakes it
    wait = f"""  {t1}
  %took = sub i64 %t1, %t0
  %many = icmp ugt i64 %mine, 1
  %div = select i1 %many, i64 %mine, i64 1
  %per = udiv i64 %took, %div
  %budget = shl i64 %per, 1
  %until = add i64 %t1, %budget
  br label %wait
{_spin(call)}
  {tnow}
  %over = sub i64 %now, %until
  %late = icmp sgt i64 %over, 0
  br i1 %late, label %block, label %wait
block:
  store atomic i32 1, ptr %pwait seq_cst, align 8
  %done2 = load atomic i64, ptr %pfin seq_cst, align 8
  %all2 = icmp uge i64 %done2, %n
  br i1 %all2, label %clear, label %sleep
sleep:
  {_futex(triple, "slept", FUTEX_WAIT_PRIVATE, 1)}
  %nblocks = atomicrmw add ptr %pblocks, i64 1 monotonic, align 8
  br label %block
clear:
  store atomic i32 0, ptr %pwait seq_cst, align 8
  br label %out"""
  else:
    t0, tdecl = "", ""
    wake = "  br label %counted"
    wait = f"  br label %wait\n{_spin(call)}\n  br label %wait"
  if blocks(triple):
    # after a launch, poll hot for as long as the helper's own last share took (the launcher is likely still in its
    # share of that launch, the next comes after it); then each poll also yields the core to any thread that wants it
    hentry = f"  {_ticks(triple, 'h0')[0]}"
    hphi = ("  %until = phi i64 [ %h0, %entry ], [ %until, %polled ], [ %huntil, %join ]\n"
            "  %since = phi i64 [ %h0, %entry ], [ %since, %polled ], [ %j1, %join ]")
    hpause = f"""  {_ticks(triple, 'hnow')[0]}
  %hover = sub i64 %hnow, %until
  %cold = icmp sgt i64 %hover, 0
  br i1 %cold, label %yield, label %polled
yield:
  {_yield(triple, "yielded")}
  br label %polled"""
    hjoin0 = f"  {_ticks(triple, 'j0')[0]}"
    hjoin1 = f"""  {_ticks(triple, 'j1')[0]}
  %jtook = sub i64 %j1, %j0
  %jmany = icmp ugt i64 %took, 1
  %jdiv = select i1 %jmany, i64 %took, i64 1
  %jper = udiv i64 %jtook, %jdiv
  %huntil = add i64 %j1, %jper"""
    # the idle bound is `iters` ticks since the last launch it joined: a yield can give the core away for a scheduler
    # slice, so a count of polls would stretch with the load
    idle = "  %idlefor = sub i64 %hnow, %since\n  %more = icmp ult i64 %idlefor, %iters"
  else:
    hentry, hphi, hpause, hjoin0, hjoin1 = "", "", "  br label %polled", "", ""
    idle = "  %more = icmp ult i64 %next, %iters"
  ticks_fn = (f"define i64 @tiny_pool_ticks() nounwind {{\nentry:\n  {_ticks(triple, 't')[0]}\n  ret i64 %t\n}}"
              if blocks(triple) else "")
  return f"""define internal i64 @work(ptr %st, i64 %gen) nounwind {{
entry:
{_FIELDS}  br label %look
look:
  %ran = phi i64 [ 0, %entry ], [ %ran, %claim ], [ %ran1, %counted ]
  %cur = load atomic i64, ptr %pnext acquire, align 8
  %g = lshr i64 %cur, 32
  %same = icmp eq i64 %g, %gen
  br i1 %same, label %check, label %out
check:
  %idx = and i64 %cur, 4294967295
  %n = load atomic i64, ptr %pn acquire, align 8
  %left = icmp ult i64 %idx, %n
  br i1 %left, label %claim, label %out
claim:
  %want = add i64 %cur, 1
  %pair = cmpxchg ptr %pnext, i64 %cur, i64 %want acq_rel acquire, align 8
  %won = extractvalue {{ i64, i1 }} %pair, 1
  br i1 %won, label %run, label %look
run:
  %tramp = load atomic ptr, ptr %ptramp monotonic, align 8
  %fn = load atomic ptr, ptr %pfn monotonic, align 8
  %args = load atomic ptr, ptr %pargs monotonic, align 8
  %core = trunc i64 %idx to i32
  call void %tramp(ptr %fn, ptr %args, i32 %core)
  %old = atomicrmw add ptr %pfin, i64 1 seq_cst, align 8
{wake}
counted:
  %ran1 = add i64 %ran, 1
  br label %look
out:
  ret i64 %ran
}}

define void @tiny_pool_main(ptr %st, i64 %gen, i64 %n, i64 %tramp, i64 %fn, i64 %args) nounwind {{
entry:
{_FIELDS}  %first = shl i64 %gen, 32
  %closed = or i64 %first, 4294967295
  store atomic i64 %closed, ptr %pnext seq_cst, align 8
  fence seq_cst
  store atomic i64 %n, ptr %pn monotonic, align 8
  store atomic i64 %tramp, ptr %ptramp monotonic, align 8
  store atomic i64 %fn, ptr %pfn monotonic, align 8
  store atomic i64 %args, ptr %pargs monotonic, align 8
  store atomic i64 0, ptr %pfin release, align 8
  store atomic i64 %first, ptr %pnext release, align 8
  store atomic i64 %gen, ptr %st release, align 8
  {t0}
  %mine = call i64 @work(ptr %st, i64 %gen)
{wait}
out:
  ret void
}}

define i64 @tiny_pool_helper(ptr %st, i64 %last, i64 %iters) nounwind {{
entry:
{hentry}
  br label %poll
poll:
  %i = phi i64 [ 0, %entry ], [ %next, %polled ], [ 0, %join ]
  %seen = phi i64 [ %last, %entry ], [ %seen, %polled ], [ %gen, %join ]
{hphi}
  %gen = load atomic i64, ptr %st acquire, align 8
  %new = icmp ne i64 %gen, %seen
  br i1 %new, label %join, label %pause
pause:
  {call}
{hpause}
polled:
  %next = add i64 %i, 1
{idle}
  br i1 %more, label %poll, label %idle
join:
{hjoin0}
  %took = call i64 @work(ptr %st, i64 %gen)
{hjoin1}
  %phelped = getelementptr i64, ptr %st, i64 7
  %prev = atomicrmw add ptr %phelped, i64 %took monotonic, align 8
  br label %poll
idle:
  ret i64 %seen
}}
{ticks_fn}
{decl}
{tdecl}
"""


def call_ir(nbufs: int, nvals: int) -> str:
  """LLVM IR of `tiny_call_<nbufs>_<nvals>(fn, args, core_id)` (see the module docstring)."""
  name = f"tiny_call_{nbufs}_{nvals}"
  body, params = [], []
  for i in range(nbufs + nvals):
    body.append(f"  %p{i} = getelementptr i64, ptr %args, i64 {i}")
    if i < nbufs:
      body.append(f"  %a{i} = load ptr, ptr %p{i}, align 8")
      params.append(f"ptr %a{i}")
    else:
      body.append(f"  %w{i} = load i64, ptr %p{i}, align 8")
      body.append(f"  %a{i} = trunc i64 %w{i} to i32")
      params.append(f"i32 %a{i}")
  params.append("i32 %core")
  nl = "\n"
  return (f"define void @{name}(ptr %fn, ptr %args, i32 %core) nounwind {{\nentry:\n{nl.join(body)}\n"
          f"  call void %fn({', '.join(params)})\n  ret void\n}}\n")


class NativePool:
  """The compiled dispatch functions for one CPU device: `main`, `helper`, and `tramp(nbufs, nvals)` (an address).
  `load(name, ir)` compiles LLVM IR and returns the loaded function's address (the device's compiler and loader)."""

  def __init__(self, load: Callable[[str, str], int], triple: str):
    self._load, self._lock = load, threading.Lock()
    self.state = (ctypes.c_int64 * WORDS)()
    self.state_addr = ctypes.addressof(self.state)
    self.main_addr = load("tiny_pool_main", pool_ir(triple))  # also called by native code: graph.CPUGraph's runner
    self.main = ctypes.CFUNCTYPE(None, ctypes.c_void_p, *[ctypes.c_int64] * 5)(self.main_addr)
    self.helper = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
      load("tiny_pool_helper", pool_ir(triple)))
    self.blocks = blocks(triple)
    """Whether the launcher blocks and the helpers yield (`blocks`); then `helper`'s `iters` counts ticks of
    `ticks()` (the CPU's tick counter), else polls."""
    self.ticks = ctypes.CFUNCTYPE(ctypes.c_int64)(load("tiny_pool_ticks", pool_ir(triple))) if self.blocks else None
    self._tramps: dict[tuple[int, int], int] = {}

  @property
  def helper_shares(self) -> int:
    """Shares the helpers have run (of every launch so far, replays' included; the launching thread's not counted)."""
    return int(self.state[7])

  @property
  def launcher_blocks(self) -> int:
    """Times a launching thread blocked (futex) waiting for a helper's share, after spinning its bound."""
    return int(self.state[9])

  def tramp(self, nbufs: int, nvals: int) -> int:
    if (t := self._tramps.get((nbufs, nvals))) is None:
      with self._lock:
        if (t := self._tramps.get((nbufs, nvals))) is None:
          t = self._tramps[(nbufs, nvals)] = self._load(f"tiny_call_{nbufs}_{nvals}", call_ir(nbufs, nvals))
    return t

  def args(self, values: list[Any]) -> Any:
    """The int64 argument block of a launch (addresses, then values)."""
    return (ctypes.c_int64 * max(1, len(values)))(*values)
