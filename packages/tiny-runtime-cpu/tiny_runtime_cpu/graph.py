"""`CPUGraph`: the CPU device's TinyJit graph (docs/PIPELINE.md §7): a replay of a run of kernels is one native call.

At build the graph lays out a native table, one entry of four int64 words per kernel: its trampoline
(`native_pool.call_ir`: calls the kernel with its exact prototype), its entry address, the address of its argument
block (int64 words: buffer addresses, then variable values) and its share count (``global_size[0]``). A replay patches
what changes between calls into those blocks (the input buffers' addresses, the Variables' values, a symbolic share
count) and makes ONE ctypes call (which releases the GIL) of `tiny_graph_run`:

- `tiny_graph_run(table, count, state, gen, main)`: for each entry in order, a kernel of one share is called inline;
  a split kernel is launched on the thread pool through `main` (`native_pool`'s `tiny_pool_main`, launch generation
  ``gen + k`` for entry k), which returns when all its shares have finished: every split kernel ends with a barrier,
  so a kernel that reads what the previous one wrote sees all of it. With no native dispatch (``state`` is 0, a pool
  without helpers) a split kernel's shares run inline, in order.

The runner is one fixed function over the table (nothing is compiled per graph). Kernels compiled with CHECK_OOB are
checked after the call, as a launch checks them. While another Python thread's native launch holds the pool, a replay
launches its kernels one by one instead (the pool's dispatch block is single-launch).
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

ENTRY_WORDS = 4  # trampoline, kernel, argument block, share count

ENTRY_IR = """  %i = phi i64 [ 0, %entry ], [ %inext, %next ]
  %w = mul i64 %i, 4
  %pt = getelementptr i64, ptr %table, i64 %w
  %tramp = load ptr, ptr %pt, align 8
  %pf = getelementptr i64, ptr %pt, i64 1
  %fn = load ptr, ptr %pf, align 8
  %pa = getelementptr i64, ptr %pt, i64 2
  %args = load ptr, ptr %pa, align 8
  %pn = getelementptr i64, ptr %pt, i64 3
  %n = load i64, ptr %pn, align 8
"""
"""LLVM IR of a runner loop's kernel block: entry %i of the table's (trampoline, kernel, argument block, share
count) words loaded into %tramp, %fn, %args, %n (the loop's %next block steps %inext; bench/profile_models.py's
timed copy of the loop shares it)."""

INLINE_IR = """inline:
  %c = phi i64 [ 0, %kernel ], [ %cnext, %share ]
  %left = icmp ult i64 %c, %n
  br i1 %left, label %share, label %next
share:
  %core = trunc i64 %c to i32
  call void %tramp(ptr %fn, ptr %args, i32 %core)
  %cnext = add i64 %c, 1
  br label %inline
"""
"""LLVM IR of a runner loop's shares 0..%n-1 on this thread, in order (entered from %kernel, leaving to %next).
"""

RUNNER_IR = """define void @tiny_graph_run(ptr %table, i64 %count, ptr %state, i64 %gen, ptr %main) nounwind {
entry:
  %pooled = icmp ne ptr %state, null
  %any = icmp ugt i64 %count, 0
  br i1 %any, label %kernel, label %out
kernel:
""" + ENTRY_IR + """  %split = icmp ugt i64 %n, 1
  %onpool = and i1 %split, %pooled
  br i1 %onpool, label %pool, label %inline
pool:
  %g = add i64 %gen, %i
  %ti = ptrtoint ptr %tramp to i64
  %fi = ptrtoint ptr %fn to i64
  %ai = ptrtoint ptr %args to i64
  call void %main(ptr %state, i64 %g, i64 %n, i64 %ti, i64 %fi, i64 %ai)
  br label %next
""" + INLINE_IR + """next:
  %inext = add i64 %i, 1
  %more = icmp ult i64 %inext, %count
  br i1 %more, label %kernel, label %out
out:
  ret void
}
"""
"""LLVM IR of the replay loop (see the module docstring)."""

RUNNER_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                 ctypes.c_void_p)


class CPUGraph:
  """TinyJit's device graph on the CPU (docs/PIPELINE.md §7): `CPUGraph(dev, kernels)` lays out the native table
  once; `graph(inputs, var_vals)` patches the argument blocks and runs every kernel in one native call.
  `CPUGraph.native_calls` counts the replays that ran natively (one call each), `CPUGraph.builds` the graphs built."""
  builds = 0
  native_calls = 0
  viz_per_kernel = True
  """Under VIZ recording TinyJit runs this graph's kernels one by one, so each gets its own timed launch."""

  @staticmethod
  def supports(dev: Any, call: Any) -> bool:
    """Kernels of the device's native programs (its `program_cls`, `cpu.CPUProgram`: taken from the device, so this
    module needs no import of `cpu`, which imports it); anything else (a copy, a Python-level op) ends a run."""
    cls = getattr(dev, "program_cls", None)
    return isinstance(cls, type) and isinstance(getattr(call, "prg", None), cls)

  def __init__(self, dev: Any, kernels: Sequence[Any]):
    from tiny_runtime_cpu.native_pool import call_ir
    self.dev, self.kernels = dev, list(kernels)
    for k in self.kernels:
      if not self.supports(dev, k): raise ValueError(f"CPUGraph takes CPU kernels only, got {k!r} (prg {k.prg!r})")
    n = len(self.kernels)
    self.table = (ctypes.c_int64 * max(1, ENTRY_WORDS * n))()
    self.blocks: list[Any] = []  # one int64 argument block per kernel, kept alive with the table
    self.dyn: list[tuple[Any, int, int]] = []  # (block, word, input slot): an input buffer's address
    self.vars: list[tuple[Any, int, str, int]] = []  # (block, word, name, capture value): a Variable's value
    self.sym: list[tuple[int, Any]] = []  # (table word, kernel): a share count that depends on Variables
    self.oob = [k.prg for k in self.kernels if k.prg._oob is not None]
    for i, k in enumerate(self.kernels):
      nb, nv = len(k.bufs), len(k.vars)
      block = (ctypes.c_int64 * max(1, nb + nv))()
      for j, b in enumerate(k.bufs):
        if isinstance(b, int): self.dyn.append((block, j, b))
        else: block[j] = b.addr
      for j, (name, val) in enumerate(k.vars):
        block[nb + j] = val
        self.vars.append((block, nb + j, name, val))
      self.blocks.append(block)
      gs, _ = k.launch({})
      tramp = dev.native_load(f"tiny_call_{nb}_{nv}", call_ir(nb, nv))
      self.table[ENTRY_WORDS * i:ENTRY_WORDS * (i + 1)] = [tramp, k.prg.addr, ctypes.addressof(block), _shares(gs)]
      if not k.static_launch: self.sym.append((ENTRY_WORDS * i + 3, k))
    # the most shares of a kernel with a fixed size (a symbolic one's count is taken per replay)
    self.max_shares = max((_shares(k.global_size) for k in self.kernels if k.static_launch), default=1)
    self.runner = RUNNER_PROTO(dev.native_load("tiny_graph_run", RUNNER_IR))
    self.table_addr, self.count = ctypes.addressof(self.table), n
    CPUGraph.builds += 1

  def _run(self, state: int, gen: int) -> None:
    main = self.dev.pool.native.main_addr if state else None
    self.runner(self.table_addr, self.count, state or None, gen, main)

  def __call__(self, inputs: Sequence[Any], var_vals: dict[str, int] | None = None) -> None:
    """Replay: the kernels in order with this call's input buffers (`inputs`: HostMem) and Variable values."""
    vv = var_vals or {}
    for block, word, slot in self.dyn: block[word] = inputs[slot].addr
    if vv:
      for block, word, name, val in self.vars: block[word] = vv.get(name, val)
    else:
      for block, word, _, val in self.vars: block[word] = val
    max_shares = self.max_shares
    for word, k in self.sym:
      self.table[word] = n = _shares(k.launch(vv)[0])
      max_shares = max(max_shares, n)
    if max_shares <= 1:  # no kernel uses the pool: no dispatch block to take
      self.runner(self.table_addr, self.count, None, 0, None)
      CPUGraph.native_calls += 1
    elif self.dev.pool.run_graph(self._run, self.count, max_shares): CPUGraph.native_calls += 1
    else: self._run_each(inputs, vv)
    for prg in self.oob:
      if prg._oob[0]: prg._raise_oob(tuple(inputs))

  def _run_each(self, inputs: Sequence[Any], vv: dict[str, int]) -> None:
    """Launch the kernels one by one (another thread's native launch holds the pool's dispatch block)."""
    for k in self.kernels:
      bufs = [inputs[b] if isinstance(b, int) else b for b in k.bufs]
      gs, ls = k.launch(vv)
      k.prg(*bufs, global_size=gs, local_size=ls, vals=tuple(vv.get(n, v) for n, v in k.vars))


def _shares(global_size: Sequence[int] | None) -> int:
  """A CPU launch's share count: ``global_size[0]`` (PIPELINE.md §4), 1 without sizes."""
  return int(global_size[0]) if global_size else 1
