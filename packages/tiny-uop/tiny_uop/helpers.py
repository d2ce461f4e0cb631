"""Small shared helpers: environment flags (one registry), `Context`, and a few pure utilities.

Every flag tiny reads from the environment is declared here once, with its meaning, as a `ContextVar`.
`Context(DEBUG=2, DEV="PYTHON")` scopes new values for the duration of a `with` block.
"""
from __future__ import annotations

import contextlib
import functools
import math
import operator
import os
import sys
import warnings
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable, converted to the type of `default` (int or str)."""
  val = os.getenv(key)
  if val is None: return default
  return type(default)(val)


class ContextVar:
  """A flag read once from the environment and overridable with `Context`."""
  _cache: dict[str, ContextVar] = {}
  __slots__ = ("key", "value", "doc")

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


class Context(contextlib.ContextDecorator):
  """Scope new values of flags: `with Context(DEBUG=2): ...`. Unknown flag names raise a KeyError naming them."""

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


@contextlib.contextmanager
def del_errors(what: str) -> Iterator[None]:
  """Run the body of a `__del__`: at interpreter shutdown (`sys.is_finalizing()`) an error is ignored (the driver or
  module it needs may be torn down already); while running it is reported as a `FinalizerWarning` naming `what`, and
  the rest of the `__del__` still runs (a free that fails is a bug to see, not to hide).

  Use:  `def __del__(self): with del_errors("CUDAProgram.__del__"): unload(self.module)`
  """
  try: yield
  except Exception as e:  # noqa: BLE001 -- reported below (raising out of __del__ would skip the caller's other frees)
    if sys.is_finalizing(): return
    warnings.warn(f"{what} failed: {type(e).__name__}: {e}", FinalizerWarning, stacklevel=3)

