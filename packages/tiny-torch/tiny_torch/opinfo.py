"""Coverage of the `tiny` device against torch's OpInfo database: `python -m tiny_torch.opinfo [--per-op N]`.

For every unary, binary, reduction and shape op of `torch.testing._internal.common_methods_invocations.op_db`, the
first N float32 samples (`op.sample_inputs("cpu", torch.float32)`) run on the CPU (the reference) and on `tiny`
(every tensor of the sample moved there); a sample passes when the outputs match (`torch.testing.assert_close`,
rtol=atol=1e-4, NaNs equal) or when both raise. It prints a markdown table (per kind: ops, samples, passed) and each
failing op with its first failure, which the package README shows.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
import unittest
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

import tiny_torch  # noqa: F401  (registers the device)

# the shape ops measured (op_db names); unary/binary/reduction come from the OpInfo classes
SHAPE_OPS = ["view", "reshape", "permute", "transpose", "t", "flatten", "unflatten", "squeeze", "unsqueeze", "expand",
             "expand_as", "narrow", "select", "split", "chunk", "unbind", "movedim", "cat", "stack", "hstack", "vstack",
             "flip", "fliplr", "flipud", "roll", "repeat", "tile", "tril", "triu", "diagonal", "diag_embed",
             "index_select", "gather", "scatter", "scatter_add", "take_along_dim", "masked_fill", "where",
             "nn.functional.pad", "clone", "contiguous", "view_as", "reshape_as", "broadcast_to", "squeeze_copy",
             "slice_scatter", "select_scatter", "index_put", "index_add", "index_copy", "index_fill", "masked_scatter",
             "swapaxes", "atleast_1d", "atleast_2d", "atleast_3d", "column_stack", "dstack", "ravel", "rot90"]


@dataclass
class Result:
  """One op's outcome: samples run, samples passed, the first failure (kind, 'error ...' or 'mismatch ...')."""
  name: str
  kind: str
  samples: int = 0
  passed: int = 0
  first_failure: str = ""
  seconds: float = 0.0
  failures: list[str] = field(default_factory=list)


def _op_db() -> list[Any]:
  """torch's OpInfo list. torch.testing._internal imports `expecttest` (a test-only package torch's wheel does not
  depend on) for its TestCase base class alone: where it is not installed, a stand-in module with unittest's
  TestCase takes its place (the OpInfo samples don't use it)."""
  if "expecttest" not in sys.modules and importlib.util.find_spec("expecttest") is None:
    stub = types.ModuleType("expecttest")
    stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
    sys.modules["expecttest"] = stub
  from torch.testing._internal.common_methods_invocations import op_db
  return op_db


def kind_of(op: Any) -> str | None:
  """'unary', 'binary', 'reduction', 'shape' or None (not measured) for an OpInfo."""
  from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo
  if isinstance(op, UnaryUfuncInfo): return "unary"
  if isinstance(op, BinaryUfuncInfo): return "binary"
  if isinstance(op, ReductionOpInfo): return "reduction"
  if op.name in SHAPE_OPS and not op.variant_test_name: return "shape"
  return None


def _to(x: Any, device: str) -> Any:
  return x.detach().to(device) if isinstance(x, torch.Tensor) else x


def _short(e: BaseException) -> str:
  msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
  return f"{type(e).__name__}: {msg[:110]}"


def run_sample(op: Any, sample: Any) -> str | None:
  """None when the op gives the same result on tiny as on the CPU for this sample, else why not."""
  args, kwargs = sample.args, sample.kwargs
  try:
    want = op(sample.input, *args, **kwargs)
  except Exception:  # noqa: BLE001 -- a sample the CPU rejects: tiny must reject it too
    want = None
  t_in, t_args, t_kwargs = tree_map(lambda x: _to(x, "tiny"), (sample.input, args, kwargs))
  try:
    got = op(t_in, *t_args, **t_kwargs)
  except Exception as e:  # noqa: BLE001 -- the failure is what this measures
    return None if want is None else f"error {_short(e)}"
  if want is None: return "no error where the CPU raises"
  got_l, _ = tree_flatten(got)
  want_l, _ = tree_flatten(want)
  if len(got_l) != len(want_l): return f"mismatch: {len(got_l)} outputs, want {len(want_l)}"
  for g, w in zip(got_l, want_l):
    if isinstance(w, torch.Tensor):
      if not isinstance(g, torch.Tensor) or g.device.type != "tiny":
        return f"mismatch: output is {type(g).__name__} on {getattr(g, 'device', None)}"
      try:
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4, equal_nan=True)
      except AssertionError as e:
        return f"mismatch: {str(e).strip().splitlines()[0][:100]}"
    elif g != w and not (isinstance(w, float) and w != w and g != g): return f"mismatch: {g!r} != {w!r}"
  return None


def measure(names: list[str] | None = None, per_op: int = 4, kinds: tuple[str, ...] = ("unary", "binary", "reduction",
                                                                                         "shape")) -> list[Result]:
  """Run the first `per_op` float32 samples of each measured op (or of the ops in `names`) on tiny and the CPU."""
  results = []
  for op in _op_db():
    kind = kind_of(op)
    full = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    if kind is None or kind not in kinds or (names is not None and full not in names): continue
    if torch.float32 not in op.supported_dtypes("cpu"): continue
    r = Result(full, kind)
    start = time.perf_counter()
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
      if i >= per_op: break
      r.samples += 1
      why = run_sample(op, sample)
      if why is None: r.passed += 1
      else:
        r.failures.append(why)
        r.first_failure = r.first_failure or why
    r.seconds = time.perf_counter() - start
    results.append(r)
  return results


def table(results: list[Result]) -> str:
  """The markdown summary: per kind ops / samples / passed, then each failing op and why."""
  lines = ["| kind | ops | samples | passed | % | wrong results |", "|---|---:|---:|---:|---:|---:|"]
  for kind in ("unary", "binary", "reduction", "shape", "all"):
    rs = [r for r in results if kind == "all" or r.kind == kind]
    s, p = sum(r.samples for r in rs), sum(r.passed for r in rs)
    wrong = sum(1 for r in rs for f in r.failures if not f.startswith("error"))  # mismatches, missing errors
    lines.append(f"| {kind} | {len(rs)} | {s} | {p} | {100 * p / max(s, 1):.1f} | {wrong} |")
  lines += ["", "| failing op | passed | first failure |", "|---|---:|---|"]
  for r in sorted(results, key=lambda r: (r.kind, r.name)):
    if r.passed < r.samples:
      lines.append(f"| {r.name} ({r.kind}) | {r.passed}/{r.samples} | {r.first_failure.replace('|', '/')} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """Command line: print the coverage table."""
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--per-op", type=int, default=4, help="samples per op (the first N of OpInfo's float32 samples)")
  ap.add_argument("ops", nargs="*", help="only these op_db names")
  a = ap.parse_args(argv)
  if a.per_op < 1: ap.error(f"--per-op must be >= 1, got {a.per_op}")
  res = measure(a.ops or None, a.per_op)
  print(table(res))
  return 0


if __name__ == "__main__":
  sys.exit(main())
