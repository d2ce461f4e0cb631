"""Native share dispatch for the CPU thread pool: launches whose shares the threads claim and run without the GIL.

The Python pool (`threads.ThreadPool`) hands a launch to its helpers through a queue: a helper that sleeps on the
queue, or on the GIL it needs to claim a share, is woken by the OS, and on a VM whose idle vCPU halts that took a
median 58 µs (p90 96 µs) in the convnet training step's replay, where the launching thread ran its share alone
meanwhile. Here a launch is published in a small shared block and claimed by native code:

- `tiny_pool_main(state, gen, n, tramp, fn, args)` (the launching thread, through ctypes, so without the GIL):
  publishes launch `gen` of `n` shares, runs shares until none are left, then waits for the helpers' shares to end.
- `tiny_pool_helper(state, last, iters)` (a helper thread, through ctypes): polls the block for a launch other than
  the last one it saw (at first `last`), runs shares of it while there are any, and polls on for the next one; after
  `iters` polls with no new launch it returns the last generation it saw (`last` when none came): the helper then
  blocks in Python until woken. It stays in native code across back-to-back launches: returning to Python after
  each one (as it did) made it wait for the GIL, which the launching thread holds between the launches of a replay
  made from Python, so it joined each launch late (an OS wake-up on a VM: 50-100 µs) or not at all.
- `tiny_call_<B>_<V>(fn, args, core_id)`: calls a kernel of B buffers and V int32 values (`args`: B addresses then V
  values, one int64 each) with its exact prototype (docs/PIPELINE.md §4), so no ABI is assumed.

A share is claimed by a compare-and-swap of `next` = generation << 32 | index, so a helper still looking at an
ended launch can never claim a share of the next one. The block's words: 0 the published generation, 1 `next`,
2 shares finished, 3 shares in all, 4 trampoline, 5 kernel, 6 arguments, 7 shares the helpers ran (a count that
only grows: `NativePool.helper_shares`, how often a second thread took part, for tests and benches). Polls use
the CPU's spin-wait hint (x86 `pause`, Arm `yield`).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

WORDS = 8


def _hint(triple: str) -> tuple[str, str]:
  """(call, declaration) of the spin-wait hint for `triple`'s CPU; none on others."""
  arch = triple.split("-")[0]
  if arch == "x86_64": return "call void @llvm.x86.sse2.pause()", "declare void @llvm.x86.sse2.pause()"
  if arch == "aarch64": return "call void @llvm.aarch64.hint(i32 1)", "declare void @llvm.aarch64.hint(i32)"
  return "", ""


_FIELDS = "".join(f"  %{name} = getelementptr i64, ptr %st, i64 {i}\n"
                  for i, name in enumerate(("pnext", "pfin", "pn", "ptramp", "pfn", "pargs"), start=1))
"""Pointers to the block's words 1-6 (see the module docstring), as both functions that use them name them."""


def pool_ir(triple: str) -> str:
  """LLVM IR of `tiny_pool_main` and `tiny_pool_helper` (see the module docstring)."""
  call, decl = _hint(triple)
  return f"""define internal i64 @work(ptr %st, i64 %gen) nounwind {{
entry:
{_FIELDS}  br label %look
look:
  %ran = phi i64 [ 0, %entry ], [ %ran, %claim ], [ %ran1, %run ]
  %cur = load atomic i64, ptr %pnext acquire, align 8
  %g = lshr i64 %cur, 32
  %same = icmp eq i64 %g, %gen
  br i1 %same, label %check, label %out
check:
  %idx = and i64 %cur, 4294967295
  %n = load i64, ptr %pn, align 8
  %left = icmp ult i64 %idx, %n
  br i1 %left, label %claim, label %out
claim:
  %want = add i64 %cur, 1
  %pair = cmpxchg ptr %pnext, i64 %cur, i64 %want acq_rel acquire, align 8
  %won = extractvalue {{ i64, i1 }} %pair, 1
  br i1 %won, label %run, label %look
run:
  %tramp = load ptr, ptr %ptramp, align 8
  %fn = load ptr, ptr %pfn, align 8
  %args = load ptr, ptr %pargs, align 8
  %core = trunc i64 %idx to i32
  call void %tramp(ptr %fn, ptr %args, i32 %core)
  %old = atomicrmw add ptr %pfin, i64 1 release, align 8
  %ran1 = add i64 %ran, 1
  br label %look
out:
  ret i64 %ran
}}

define void @tiny_pool_main(ptr %st, i64 %gen, i64 %n, i64 %tramp, i64 %fn, i64 %args) nounwind {{
entry:
{_FIELDS}  store i64 %n, ptr %pn, align 8
  store i64 %tramp, ptr %ptramp, align 8
  store i64 %fn, ptr %pfn, align 8
  store i64 %args, ptr %pargs, align 8
  store atomic i64 0, ptr %pfin release, align 8
  %first = shl i64 %gen, 32
  store atomic i64 %first, ptr %pnext release, align 8
  store atomic i64 %gen, ptr %st release, align 8
  %mine = call i64 @work(ptr %st, i64 %gen)
  br label %wait
wait:
  %done = load atomic i64, ptr %pfin acquire, align 8
  %all = icmp uge i64 %done, %n
  br i1 %all, label %out, label %pause
pause:
  {call}
  br label %wait
out:
  ret void
}}

define i64 @tiny_pool_helper(ptr %st, i64 %last, i64 %iters) nounwind {{
entry:
  br label %poll
poll:
  %i = phi i64 [ 0, %entry ], [ %next, %pause ], [ 0, %join ]
  %seen = phi i64 [ %last, %entry ], [ %seen, %pause ], [ %gen, %join ]
  %gen = load atomic i64, ptr %st acquire, align 8
  %new = icmp ne i64 %gen, %seen
  br i1 %new, label %join, label %pause
pause:
  {call}
  %next = add i64 %i, 1
  %more = icmp ult i64 %next, %iters
  br i1 %more, label %poll, label %idle
join:
  %took = call i64 @work(ptr %st, i64 %gen)
  %phelped = getelementptr i64, ptr %st, i64 7
  %prev = atomicrmw add ptr %phelped, i64 %took monotonic, align 8
  br label %poll
idle:
  ret i64 %seen
}}
{decl}
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
    self._tramps: dict[tuple[int, int], int] = {}

  @property
  def helper_shares(self) -> int:
    """Shares the helpers have run (of every launch so far, replays' included; the launching thread's not counted)."""
    return int(self.state[7])

  def tramp(self, nbufs: int, nvals: int) -> int:
    if (t := self._tramps.get((nbufs, nvals))) is None:
      with self._lock:
        if (t := self._tramps.get((nbufs, nvals))) is None:
          t = self._tramps[(nbufs, nvals)] = self._load(f"tiny_call_{nbufs}_{nvals}", call_ir(nbufs, nvals))
    return t

  def args(self, values: list[Any]) -> Any:
    """The int64 argument block of a launch (addresses, then values)."""
    return (ctypes.c_int64 * max(1, len(values)))(*values)
