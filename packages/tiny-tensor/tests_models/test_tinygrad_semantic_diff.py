"""Semantic diff against tinygrad 0.14: the programs of `semdiff_programs.py` run through tiny_tensor (here) and the
tinygrad==0.14.0 wheel (one subprocess on its PYTHON device, so its environment doesn't leak into other tests); their
results (values, dtypes, shapes) and exception types must agree.

A program whose difference is intended is in INTENDED, with why, and named in the tiny-tensor README section
"Intended differences from tinygrad 0.14"; one that differs because another change fixes it in parallel is in
PENDING (the integrator empties it after the merge). The test fails on any other difference, on an INTENDED entry
that no longer differs (stale), and lists PENDING entries that already agree.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tinygrad", reason="tinygrad==0.14.0 is a test oracle (BENCH_DEPS)")

import semdiff_programs  # (conftest puts this folder on sys.path)

HERE = pathlib.Path(__file__).resolve().parent
README = HERE.parent / "README.md"
RTOL, ATOL = 1e-5, 1e-6

# program name -> why the difference is intended (each named in the README section)
_WEAK = "tinygrad keeps a weak dtype (weakfloat/weakint) for Python scalars; we give the default dtype, as torch"
_ASSERT = "tinygrad raises AssertionError for a bad value; we raise ValueError naming it (python -O drops asserts)"
_INTO_MODEL_DTYPE = "load_state_dict copies into the model's dtype (torch); tinygrad takes the state_dict tensor's"
INTENDED: dict[str, str] = {
  "create_scalar": _WEAK, "where_scalars": _WEAK, "promo_int_plus_float_scalar": _WEAK, "one_hot": _WEAK,
  "index_bool_scalar_mask": "tinygrad fails inside its shape code (RuntimeError); we refuse a bool index (IndexError)",
  "backward_nonscalar_direct": "torch's RuntimeError for backward() of a non-scalar without gradient=, not an assert",
  "nn_load_state_dict_scalar_vs_vec": _INTO_MODEL_DTYPE, "nn_load_state_dict_casts": _INTO_MODEL_DTYPE,
  "nn_parameters_shared_dedup": "get_parameters lists a shared tensor once (torch's parameters()); tinygrad repeats it",
  "jit_optimizer_step": "a loss realized after opt.step() has its value before the step (torch's); tinygrad computes "
                        "it from the updated weights",
  "jit_shape_change": "tinygrad replays the captured kernels on a (3,) input and returns 2 elements; we raise JitError",
  "item_multi_element": _ASSERT, "variable_bind_out_of_range": _ASSERT, "stack_shape_mismatch": _ASSERT,
  "optim_unused_param": "a parameter with no .grad (unused in the loss) is left alone, as in torch; tinygrad asserts",
  "isclose_allclose": "allclose returns a Python bool (torch, numpy); tinygrad returns a 0-d Tensor",
}

# program name -> why it differs today: another engineer fixes it in parallel (the integrator empties this)
PENDING: dict[str, str] = {}


# a 16-bit float result is compared to its precision: tinygrad's PYTHON device computes halves in Python floats
LOW_PRECISION_RTOL = {"half": 2e-3, "bfloat16": 1e-2}


def _same(a, b, path: str = "", rtol: float = RTOL) -> str | None:
  """None if the normalized results agree (floats to rtol/ATOL, NaN equal to NaN), else where they first differ."""
  if isinstance(a, dict) and isinstance(b, dict):
    if "float" in a and "float" in b:
      x, y = a["float"], b["float"]
      if isinstance(x, str) or isinstance(y, str): return None if x == y else f"{path}: {x} != {y}"
      return None if math.isclose(x, y, rel_tol=rtol, abs_tol=ATOL) else f"{path}: {x} != {y}"
    if a.keys() != b.keys(): return f"{path}: {a} != {b}"
    if "tensor" in a: rtol = max(rtol, LOW_PRECISION_RTOL.get(a.get("dtype"), rtol))
    for k in a:
      if (d := _same(a[k], b[k], f"{path}.{k}", rtol)) is not None: return d
    return None
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b): return f"{path}: length {len(a)} != {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
      if (d := _same(x, y, f"{path}[{i}]", rtol)) is not None: return d
    return None
  return None if a == b and type(a) is type(b) else f"{path}: {a!r} != {b!r}"


def _diff(ours: dict, theirs: dict) -> str | None:
  if "exc" in ours or "exc" in theirs:
    if ours.get("exc") == theirs.get("exc"): return None
    return f"tiny {ours.get('exc', 'ok')} ({ours.get('msg', '')[:80]}) vs tinygrad {theirs.get('exc', 'ok')} " \
           f"({theirs.get('msg', '')[:80]})"
  return _same(ours["ok"], theirs["ok"], "result")


@pytest.fixture(scope="module")
def results() -> tuple[dict, dict]:
  env = {**os.environ, "DEV": "PYTHON;CPU:X86"}  # device-less constants realize on CPU: its no-compiler renderer
  for k in ("PYTHON", "CPU", "DEBUG", "JIT"): env.pop(k, None)
  env.pop("PYTHONPATH", None)  # tinygrad's side imports nothing of ours
  proc = subprocess.run([sys.executable, str(HERE / "semdiff_programs.py"), "tinygrad"], env=env, cwd=str(HERE),
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  theirs = json.loads(proc.stdout.strip().splitlines()[-1])
  ours = semdiff_programs.run_all(semdiff_programs.load_library("tiny"))
  return ours, theirs


def test_program_table_is_large_and_named_consistently():
  assert len(semdiff_programs.PROGRAMS) >= 150
  unknown = sorted((set(INTENDED) | set(PENDING)) - set(semdiff_programs.PROGRAMS))
  assert unknown == [], f"INTENDED/PENDING name programs that don't exist: {unknown}"
  assert not set(INTENDED) & set(PENDING)


def test_intended_differences_are_in_the_readme():
  text = README.read_text()
  assert "## Intended differences from tinygrad 0.14" in text
  section = text.split("## Intended differences from tinygrad 0.14", 1)[1].split("\n## ", 1)[0]
  missing = [n for n in INTENDED if f"`{n}`" not in section]
  assert missing == [], f"INTENDED programs not named in the README section: {missing}"


def test_no_unlisted_difference(results):
  ours, theirs = results
  assert sorted(ours) == sorted(theirs)
  diffs = {n: d for n in ours if (d := _diff(ours[n], theirs[n])) is not None}
  unexpected = {n: d for n, d in diffs.items() if n not in INTENDED and n not in PENDING}
  assert unexpected == {}, "differences from tinygrad 0.14 not listed as intended:\n" + \
    "\n".join(f"  {n}: {d}" for n, d in sorted(unexpected.items()))


def test_intended_entries_still_differ(results):
  ours, theirs = results
  stale = [n for n in INTENDED if _diff(ours[n], theirs[n]) is None]
  assert stale == [], f"INTENDED entries that now agree with tinygrad (remove them and their README line): {stale}"


def test_pending_entries_that_already_agree(results):
  """PENDING entries are fixed by parallel changes: once one agrees, it must leave PENDING."""
  ours, theirs = results
  done = [n for n in PENDING if _diff(ours[n], theirs[n]) is None]
  assert done == [], f"PENDING entries that already agree with tinygrad (remove them from PENDING): {done}"
