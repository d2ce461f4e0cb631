"""tinygrad 0.14 API semantics (issue #35): package attributes, Context flag names, dtype arguments and conversions,
and internal errors that must not surface. Each case checks numbers against torch / numpy / ml_dtypes, or names against
tinygrad 0.14 itself."""
import subprocess
import sys

import numpy as np
import pytest

from tiny_tensor import Context, Tensor, dtypes


def test_nn_is_a_lazy_package_attribute():
  # tinygrad: `import tinygrad; tinygrad.nn.Linear` works. A fresh interpreter: other tests may have imported nn
  code = ("import sys, tiny_tensor\n"
          "eager = 'tiny_tensor.nn' in sys.modules\n"
          "lin = tiny_tensor.nn.Linear(3, 2)\n"
          "print(eager, type(lin).__name__, lin.weight.shape, 'nn' in dir(tiny_tensor))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["False", "Linear", "(2,", "3)", "True"]
  import tiny_tensor
  with pytest.raises(AttributeError, match="no attribute 'not_a_module'"): tiny_tensor.not_a_module  # noqa: B018


def _tinygrad_flag_names() -> set[str]:
  import tinygrad.helpers as tgh
  import tinygrad.uop.ops  # noqa: F401  (declares TRACK_MATCH_STATS, REWRITE_STACK_LIMIT)
  return set(tgh.ContextVar._cache)


def test_context_accepts_every_tinygrad_flag():
  names = _tinygrad_flag_names()
  assert {"IGNORE_BEAM_CACHE", "WINO", "JIT_BATCH_SIZE", "DEBUG"} <= names  # the reference really was read
  for name in sorted(names):
    with Context(**{name: 0 if name not in ("DEV", "DEFAULT_FLOAT", "DEFAULT_INT", "EMULATED_DTYPES") else ""}): pass


def test_context_implemented_flags_take_effect_and_unknown_raise():
  from tiny_codegen.opt import search
  from tiny_tensor import multi
  with Context(IGNORE_BEAM_CACHE=1): assert bool(search.IGNORE_BEAM_CACHE)
  assert not search.IGNORE_BEAM_CACHE
  with Context(RING=0): assert not multi.RING
  with pytest.raises(KeyError, match=r"NOT_A_FLAG.*known:.*IGNORE_BEAM_CACHE"): Context(NOT_A_FLAG=1)


def test_context_noop_flags_are_documented():
  import pathlib

  from tiny_uop.helpers import TINYGRAD_NOOP_FLAGS
  readme = (pathlib.Path(__file__).parents[2] / "tiny-uop" / "README.md").read_text()
  assert (missing := [k for k in TINYGRAD_NOOP_FLAGS if f"`{k}`" not in readme]) == [], missing
