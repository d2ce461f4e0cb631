"""The onnx package's node conformance cases run through OnnxRunner: one result per case.

The onnx wheel ships the generators of its node cases (`onnx.backend.test.case.node`: each operator's `export_*`
functions build a one-node model and compute the expected outputs with numpy); `collect_testcases` runs them. A case
passes when every output has the expected shape, the dtype tiny uses for that ONNX type, and values within the case's
rtol/atol (NaNs in the same places).

    python tests_models/onnx_conformance.py [substring ...]    # prints each failure and the pass rate
"""
from __future__ import annotations

import sys
import time
import traceback
import warnings
from typing import Any

import numpy as np


def collect() -> list[Any]:
  """Every node case of the installed onnx package (TestCase objects with name, model, data_sets, rtol, atol)."""
  from onnx.backend.test.case.node import collect_testcases
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")
    return list(collect_testcases(None))


def _expected_dtype(v: Any) -> Any:
  from tiny_tensor.nn.onnx import onnx_dtype
  t = v.type
  if t.HasField("tensor_type"): return None if t.tensor_type.elem_type == 8 else onnx_dtype(t.tensor_type.elem_type)
  return None


def _value(v: Any) -> Any:
  """A case's input/output value as numpy (some cases store exotic types as TensorProto)."""
  import onnx
  from onnx import numpy_helper
  if isinstance(v, onnx.TensorProto): return numpy_helper.to_array(v)
  if isinstance(v, list): return [_value(x) for x in v]
  return v if v is None else np.asarray(v)


def _compare(got: Any, exp: Any, info: Any, rtol: float, atol: float, name: str) -> None:
  from tiny_tensor import Tensor
  exp = _value(exp)
  if isinstance(exp, list):
    assert isinstance(got, list) and len(got) == len(exp), f"{name}: sequence of {len(exp)} expected, got {type(got)}"
    for g, e in zip(got, exp): _compare(g, e, None, rtol, atol, name)
    return
  if exp is None:
    assert got is None, f"{name}: an empty optional expected"
    return
  exp = np.asarray(exp)
  if exp.dtype.kind in "OUS":
    g = np.asarray(got, dtype=object)
    assert g.shape == exp.shape and [str(a) for a in g.reshape(-1)] == [str(a) for a in exp.reshape(-1)], \
      f"{name}: strings {g} != {exp}"
    return
  assert isinstance(got, Tensor), f"{name}: a Tensor expected, got {type(got).__name__}"
  want_dt = _expected_dtype(info) if info is not None else None
  if want_dt is not None: assert got.dtype == want_dt, f"{name}: dtype {got.dtype}, expected {want_dt}"
  g = got.numpy()
  assert g.shape == exp.shape, f"{name}: shape {g.shape}, expected {exp.shape}"
  if exp.dtype.kind in "biu" and exp.dtype.itemsize >= 1 and not exp.dtype.name.startswith(("int4", "uint4", "int2",
                                                                                               "uint2")):
    np.testing.assert_array_equal(g, exp, err_msg=name)
  else:
    np.testing.assert_allclose(g.astype(np.float64), exp.astype(np.float64), rtol=rtol, atol=atol, err_msg=name,
                               equal_nan=True)


def run_case(case: Any) -> None:
  """Run one node case; raises AssertionError (wrong result) or another exception (could not run). Each data set runs
  three times through one runner: an eager call builds the graph, the second of an input signature records its
  schedule and the third replays it (OnnxRunner's doc, "Eager calls"), so every case checks the replay too (and,
  with several data sets of one signature, a replay on other data)."""
  from tiny_tensor.nn.onnx import OnnxRunner
  runner = OnnxRunner(case.model, device="CPU")
  g = case.model.graph
  in_names = [i.name for i in g.input if i.name not in {t.name for t in g.initializer}]
  for call in (1, 2, 3):
    for inputs, outputs in case.data_sets:
      feed = {n: _value(v) for n, v in zip(in_names, inputs)}
      with np.errstate(all="ignore"): got = runner(feed)
      for o, exp in zip(g.output, outputs):
        _compare(got[o.name], exp, o, case.rtol, case.atol, f"{case.name}:{o.name} (call {call})")


def run_all(cases: list[Any], verbose: bool = False) -> dict[str, str | None]:
  """{case name: None when it passed, else the first line of why not}."""
  res: dict[str, str | None] = {}
  for c in cases:
    if "--trace" in sys.argv: print(f"RUN {c.name}", flush=True)
    try:
      run_case(c)
      res[c.name] = None
    except Exception as e:  # a conformance report: every failure is recorded, none stops the run
      msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
      res[c.name] = msg
      if verbose: print(f"FAIL {c.name}: {msg}")
      if verbose and "-v" in sys.argv: traceback.print_exc()
  return res


def op_of(case: Any, all_cases: dict[str, Any] | None = None) -> str:
  """The operator a case is about: its node's, or for an `_expanded` case (the operator's function body as a graph of
  simpler operators) the operator of the case it expands."""
  if "_expanded" in case.name and all_cases and (twin := all_cases.get(case.name.split("_expanded")[0])) is not None:
    return op_of(twin)
  return next((n.op_type for n in case.model.graph.node), "?")


if __name__ == "__main__":
  st = time.time()
  cases = collect()
  pats = [a for a in sys.argv[1:] if not a.startswith("-")]
  if pats: cases = [c for c in cases if any(p in c.name for p in pats)]
  print(f"collected {len(cases)} cases in {time.time() - st:.1f}s")
  st = time.time()
  res = run_all(cases, verbose=True)
  passed = sum(v is None for v in res.values())
  rate = 100 * passed / max(len(res), 1)
  print(f"{passed} passed, {len(res) - passed} failed: {rate:.1f}% in {time.time() - st:.1f}s")
