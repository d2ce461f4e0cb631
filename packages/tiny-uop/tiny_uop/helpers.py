"""Small shared helpers: environment flags (one registry), `Context`, and a few pure utilities.

Every flag tiny reads from the environment is declared here once, with its meaning, as a `ContextVar`.
`Context(DEBUG=2, DEV="PYTHON")` scopes new values for the duration of a `with` block.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
import os
import sys
import warnings
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable, converted to the type of `default` (int or str)."""
  val = os.getenv(key)
  if val is None: return default
  return type(default)(val)


_FLAG_WRITES = itertools.count(1)


class ContextVar:
  """A flag read once from the environment and overridable with `Context`.

  `ContextVar.version` changes with every write of any flag's `value` (through `Context` or a direct `.value =`): a
  cache of something derived from flag values is still good while the version it was made at is the current one.
  Reads of `.value` stay a plain slot read (only writes go through `__setattr__`).
  """
  _cache: dict[str, ContextVar] = {}
  __slots__ = ("key", "value", "doc")
  version: ClassVar[int] = 0

  def __setattr__(self, name: str, v: Any) -> None:
    object.__setattr__(self, name, v)
    # a fresh number from a counter (atomic under the GIL), stored after the value: two threads writing at once never
    # leave a version that a cache was made at before either value was written
    if name == "value": ContextVar.version = next(_FLAG_WRITES)

  def __init__(self, key: str, default: Any, doc: str = ""):
    if key in ContextVar._cache: raise RuntimeError(f"ContextVar {key!r} is declared twice")
    ContextVar._cache[key] = self
    self.key, self.doc = key, doc
    self.value = getenv(key, default)

  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x: Any) -> bool: return self.value >= x
  def __gt__(self, x: Any) -> bool: return self.value > x
  def __le__(self, x: Any) -> bool: return self.value <= x
  def __lt__(self, x: Any) -> bool: return self.value < x
  def __eq__(self, x: Any) -> bool: return self.value == x
  def __hash__(self) -> int: return hash(self.key)
  def __repr__(self) -> str: return f"ContextVar({self.key}={self.value!r})"


def config_changed() -> None:
  """Bump `ContextVar.version` for a change that is no flag write but changes what kernels compile to or run with (a
  device's renderer set directly): caches kept while the version stands (the engine's eager replays) check again."""
  ContextVar.version = next(_FLAG_WRITES)


class Context(contextlib.ContextDecorator):
  """Scope new values of flags: `with Context(DEBUG=2): ...`. Unknown flag names raise a KeyError naming them.

  Every flag name tinygrad 0.14 defines is accepted; those tiny does not act on are listed, with why, in
  `TINYGRAD_NOOP_FLAGS` (setting them changes nothing).
  """

  def __init__(self, **kwargs: Any):
    unknown = [k for k in kwargs if k not in ContextVar._cache]
    if unknown: raise KeyError(f"unknown Context flag(s) {unknown}; known: {sorted(ContextVar._cache)}")
    self.kwargs = kwargs

  def __enter__(self) -> Context:
    self.old = {k: ContextVar._cache[k].value for k in self.kwargs}
    for k, v in self.kwargs.items(): ContextVar._cache[k].value = v
    return self

  def __exit__(self, *exc: Any) -> None:
    for k, v in self.old.items(): ContextVar._cache[k].value = v


# ***** the registry of environment flags *****
DEBUG = ContextVar("DEBUG", 0, "verbosity: 1 a summary per realize with totals, 2 a line per kernel with running "
                   "totals, 3 schedule and opts, 4 each kernel's source (once), 5 linear UOps, 6 kernel ASTs, 7 every "
                   "lowering stage")
DEV = ContextVar("DEV", "", "target device string [IFACE+]DEVICE[:RENDERER[:ARCH]], ';'-separated")
SPEC = ContextVar("SPEC", 0, "verify UOp graphs against the spec between passes")
BEAM = ContextVar("BEAM", 0, "beam width for kernel optimization search (0: hand-coded heuristics)")
NOOPT = ContextVar("NOOPT", 0, "apply no kernel optimizations")
USE_TC = ContextVar("TC", 1, "the hand-coded heuristic maps matmuls onto the renderer's tensor cores; 0: never")
IMAGE = ContextVar("IMAGE", 0, "OpenCL: kernels read their read-only float32 buffers as images (Adreno)")
TRACK_MATCH_STATS = ContextVar("TRACK_MATCH_STATS", 0, "count rewrite-rule matches per pattern (2: print them)")
CPU_THREADS = ContextVar("CPU_THREADS", 0, "worker threads for CPU kernels (0: one per core)")
CPU_LOADER = ContextVar("CPU_LOADER", "", "what places the CPU's LLVM objects: '' (auto: tiny's ELF loader for x86-64, "
                        "MCJIT elsewhere), ELF or MCJIT (read when a kernel is loaded)")
CHECK_OOB = ContextVar("CHECK_OOB", 0, "CPU kernels bounds-check every load/store; an out-of-bounds access raises "
                       "naming the kernel, buffer, index and size (read when a kernel is compiled)")
TINY_PLUGINS = ContextVar("TINY_PLUGINS", "", "comma-separated allow-list of device plugins")
CACHELEVEL = ContextVar("CACHELEVEL", 2, "0 disables the on-disk compile cache")
JIT = ContextVar("JIT", 1, "0 disables TinyJit capture (functions run eagerly)")
HCQ2 = ContextVar("HCQ2", 1, "TinyJit replays on HCQ devices go through the HCQ2 passes (tiny_uop.hcq2); 2: print "
                  "every pass's output (0 is refused: the imperative HCQGraph is gone; JIT=2 replays without graphs)")
PROFILE = ContextVar("PROFILE", 0, "collect per-kernel timings")
TRAINING = ContextVar("TRAINING", 0, "1: training mode (dropout etc. active); also `Tensor.training`")
VIZ = ContextVar("VIZ", 0, "1: record schedules, kernels, every graph_rewrite and launches into a trace "
                 "(tiny_tensor.viz), print how to view it at exit and serve it when stdout is a terminal")
VIZ_OUT = ContextVar("VIZ_OUT", "", "where VIZ=1 writes its trace (default: tiny-viz-PID.jsonl in the temp dir)")
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0, "1: BEAM searches again instead of reusing a cached result "
                               "(read at each search)")
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "float32", "the dtype of Python floats in tensors "
                           "(`dtypes.default_float`): a float dtype's name, as tinygrad's")
DEFAULT_INT = ContextVar("DEFAULT_INT", "int32", "the dtype of Python ints in tensors (`dtypes.default_int`): an int "
                         "dtype's name, as tinygrad's")
WINO = ContextVar("WINO", 0, "1: Tensor.conv2d lowers every 3x3 stride-1 ungrouped 2-d conv as Winograd F(4x4, 3x3) "
                 "(tinygrad's flag; forward and backward; tiny_tensor.winograd). The ONNX runner picks per conv: "
                 "ONNX_WINO")
ONNX_WINO = ContextVar("ONNX_WINO", 1, "the ONNX runner's 3x3 stride-1 convs with a fixed weight on the CPU: 1 "
                       "Winograd where tiny_tensor.winograd.winograd_tile's machine-model rule says it pays, 0 direct")
RING = ContextVar("RING", 1, "multi-device allreduce over more than 2 devices: 1 ring, 0 naive (read at each "
                  "allreduce)")

# ***** tinygrad 0.14's other flags: accepted, no effect *****
# tinygrad code sets these (`Context(LRU=0)`, `JIT_BATCH_SIZE=8 python ...`); tiny accepts each name and value so that
# such code runs unchanged, and acts on none of them. Each line says what it does in tinygrad and why tiny ignores it.
# (The names tinygrad 0.14 defines that tiny implements are declared above: DEBUG, DEV, BEAM, NOOPT, IMAGE, JIT, TC,
# TRAINING, WINO, CACHELEVEL, IGNORE_BEAM_CACHE, RING, DEFAULT_FLOAT, DEFAULT_INT, VIZ, PROFILE, SPEC, CHECK_OOB,
# TRACK_MATCH_STATS.)
TINYGRAD_NOOP_FLAGS: dict[str, tuple[Any, str]] = {
  "FLOAT16": (0, "tinygrad's example scripts: half-precision weights; tiny models take a dtype argument"),
  "OPENPILOT_HACKS": (0, "tinygrad's openpilot-specific kernel workarounds; tiny has none"),
  "JIT_BATCH_SIZE": (32, "kernels per batched graph in tinygrad's JIT; tiny's JIT replays one graph per capture"),
  "CAPTURING": (1, "tinygrad's internal JIT capture switch (not a user setting)"),
  "TRACEMETA": (1, "tinygrad's op metadata tracing; tiny's VIZ records its own"),
  "NO_COLOR": (0, "tinygrad's colored DEBUG output; tiny prints no colors"),
  "TC_SELECT": (-1, "which tensor core tinygrad picks; tiny picks the renderer's first that fits"),
  "TC_OPT": (0, "tinygrad's tensor-core padding level; tiny's heuristic decides"),
  "TRANSCENDENTAL": (1, "tinygrad's forced software sin/exp/log; tiny decomposes per renderer"),
  "NOLOCALS": (0, "tinygrad's ban on local memory in opts; tiny's BEAM/heuristic decide"),
  "SPLIT_REDUCEOP": (1, "tinygrad's split of large reductions; tiny's scheduler decides"),
  "NO_MEMORY_PLANNER": (0, "tinygrad's buffer-reuse planner switch; tiny's JIT plans memory always"),
  "LRU": (1, "tinygrad's allocator LRU cache switch; tiny's allocators keep their own"),
  "ALL2ALL": (0, "tinygrad's all-to-all allreduce; tiny has ring and naive (RING)"),
  "ALLREDUCE_CAST": (1, "tinygrad's allreduce in a narrower dtype; tiny reduces in the tensor's dtype"),
  "VALIDATE_WITH_CPU": (0, "tinygrad re-runs kernels on CPU to compare; tiny tests do that instead"),
  "DISABLE_FAST_IDIV": (1, "tinygrad's magic-number integer division switch; tiny's lowering decides"),
  "FUSE_OPTIM": (0, "tinygrad fuses optimizer steps into one kernel; tiny's scheduler decides"),
  "ALLOW_DEVICE_USAGE": (1, "tinygrad's guard against device use in tests"),
  "MAX_BUFFER_SIZE": (0, "tinygrad's cap on one buffer's size"),
  "MAX_KERNEL_BUFFERS": (0, "tinygrad's cap on buffers per kernel; tiny's renderers state their own"),
  "EMULATED_DTYPES": ("", "dtypes tinygrad emulates on request; tiny emulates what a renderer lacks, always"),
  "CAPTURE_PROCESS_REPLAY": (0, "tinygrad's CI kernel-diff capture"),
  "NUM_CPU_THREADS": (0, "tinygrad's CPU worker count; tiny's is CPU_THREADS"),
  "NULL_ALLOW_COPYOUT": (0, "tinygrad's NULL device copy-out switch; tiny has no NULL device"),
  "PARALLEL": (0, "tinygrad's parallel BEAM compiles; tiny's BEAM compiles in one process"),
  "PCONTIG": (0, "tinygrad's rangeify partial-contiguous switch; tiny has no rangeify"),
  "DEBUG_RANGEIFY": (0, "tinygrad's rangeify debug output; tiny has no rangeify"),
  "TUPLE_ORDER": (1, "tinygrad's linearizer sort order; tiny's linearizer has one order"),
  "CCACHE": (1, "tinygrad's compiler cache switch; tiny's is CACHELEVEL"),
  "ALLOW_TF32": (0, "tinygrad's TF32 tensor cores on NVIDIA; tiny keeps float32 matmuls in float32"),
  "SCACHE": (1, "tinygrad's schedule cache switch; tiny's is SCHEDULE_CACHE"),
  "USE_ATOMICS": (0, "tinygrad's atomic embedding backward; tiny's uses no atomics"),
  "DISALLOW_BROADCAST": (0, "tinygrad's debugging ban on implicit broadcasts"),
  "REWRITE_STACK_LIMIT": (250000, "tinygrad's graph_rewrite depth guard; tiny's rewrites use no stack limit"),
  "SQTT": (0, "tinygrad's AMD thread traces; tiny's AMD runtime has none"),
  "SQTT_ITRACE_SE_MASK": (3, "as SQTT"), "SQTT_LIMIT_SE": (0, "as SQTT"), "SQTT_SIMD_SEL": (0, "as SQTT"),
  "SQTT_TOKEN_EXCLUDE": (0, "as SQTT"),
  "PMC": (0, "tinygrad's AMD performance counters; tiny's AMD runtime has none"),
  "PMA": (0, "tinygrad's NVIDIA performance monitor; tiny's NV runtime has none"),
  "HCQ_RUNTIME_DEV": ("CPU", "the device tinygrad's HCQ2 runtime runs on; tiny's hcq2 passes need none"),
}
for _k, (_default, _why) in TINYGRAD_NOOP_FLAGS.items():
  ContextVar(_k, _default, "no effect in tiny (tinygrad: " + _why + ")")


# ***** pure utilities *****
def prod(x: Iterable[T], start: Any = 1) -> Any:
  """Product of the items (works for ints and symbolic UOps)."""
  return functools.reduce(operator.mul, x, start)


def dedup(x: Iterable[T]) -> list[T]:
  """Items in first-seen order, without repeats."""
  return list(dict.fromkeys(x))


def argsort(x: Sequence[Any]) -> list[int]:
  return sorted(range(len(x)), key=x.__getitem__)


def all_same(items: Sequence[Any]) -> bool:
  return all(x == items[0] for x in items)


def all_int(t: Iterable[Any]) -> bool:
  return all(isinstance(s, int) for s in t)


def flatten(x: Iterable[Iterable[T]]) -> list[T]:
  return [item for sub in x for item in sub]


def ceildiv(num: Any, amt: Any) -> Any:
  return -(num // -amt) if isinstance(num, int) and isinstance(amt, int) else (num + amt - 1) // amt


def round_up(num: int, amt: int) -> int:
  return ceildiv(num, amt) * amt


def strides_for_shape(shape: Sequence[Any]) -> tuple[Any, ...]:
  """Row-major strides; dimensions of size 1 get stride 0."""
  if not shape: return ()
  strides = [1]
  for s in reversed(shape[1:]): strides.insert(0, strides[0] * s)
  return tuple(0 if s == 1 else st for s, st in zip(shape, strides))


def to_tuple(x: Any) -> tuple:
  return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def merge_dicts(ds: Iterable[dict]) -> dict:
  out: dict = {}
  for d in ds:
    for k, v in d.items():
      if k in out and out[k] != v: raise ValueError(f"conflicting values for {k!r}: {out[k]!r} and {v!r}")
      out[k] = v
  return out


def is_pow2(x: int) -> bool: return x > 0 and (x & (x - 1)) == 0


def unwrap(x: T | None) -> T:
  assert x is not None
  return x


def partition(items: Iterable[T], fn: Callable[[T], bool]) -> tuple[list[T], list[T]]:
  a: list[T] = []
  b: list[T] = []
  for it in items: (a if fn(it) else b).append(it)
  return a, b


@contextlib.contextmanager
def temp_env(**kv: str) -> Iterator[None]:
  old = {k: os.environ.get(k) for k in kv}
  os.environ.update(kv)
  try: yield
  finally:
    for k, v in old.items():
      if v is None: os.environ.pop(k, None)
      else: os.environ[k] = v


def cache_dir() -> str:
  """Folder for on-disk caches (compiled kernels, BEAM results): $TINY_CACHE_DIR or ~/.cache/tiny."""
  d = os.getenv("TINY_CACHE_DIR") or os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tiny")
  os.makedirs(d, exist_ok=True)
  return d


def polyN(x: Any, p: Sequence[float]) -> Any:
  """Horner evaluation of a polynomial with coefficients highest-first."""
  return functools.reduce(lambda acc, c: acc * x + c, p, 0.0)


def is_nan(x: float) -> bool: return isinstance(x, float) and math.isnan(x)


class FinalizerWarning(RuntimeWarning):
  """A `__del__` failed while the interpreter was running: the resource it frees may have leaked."""


class del_errors:
  """Run the body of a `__del__`: at interpreter shutdown (`sys.is_finalizing()`) an error is ignored (the driver or
  module it needs may be torn down already); while running it is reported as a `FinalizerWarning` naming `what`, and
  the rest of the `__del__` still runs (a free that fails is a bug to see, not to hide).

  Bind it as a default argument, so that it is still there when module globals are cleared at shutdown (a `__del__`
  that looks `del_errors` up as a global then finds None); it keeps what it calls on the class for the same reason.
  Use:  `def __del__(self, _errors=del_errors): with _errors("CUDAProgram.__del__"): unload(self.module)`
  """
  __slots__ = ("what",)
  _finalizing = staticmethod(sys.is_finalizing)
  _warn = staticmethod(warnings.warn)
  _category = FinalizerWarning

  def __init__(self, what: str) -> None: self.what = what

  def __enter__(self) -> None: return None

  def __exit__(self, typ: Any, e: Any, tb: Any) -> bool:
    # an Exception is reported (raising out of __del__ would skip the caller's other frees); BaseExceptions propagate
    if typ is None or not issubclass(typ, Exception): return False
    cls = type(self)
    if not cls._finalizing(): cls._warn(f"{self.what} failed: {typ.__name__}: {e}", cls._category, stacklevel=2)
    return True

