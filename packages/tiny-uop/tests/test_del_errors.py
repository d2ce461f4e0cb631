"""`__del__` errors: silent only at interpreter shutdown; while running, a failing free is reported as a
`FinalizerWarning` (it used to be swallowed by `except Exception: pass`, hiding double frees and leaks)."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import warnings

import pytest

from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.helpers import FinalizerWarning, del_errors


class _RejectingAllocator:
  def __init__(self): self.calls: list = []

  def free(self, opaque, nbytes, options):
    self.calls.append((opaque, nbytes))
    raise OSError(f"driver rejected free({opaque})")


class _Buf(Buffer):
  """A Buffer whose allocator refuses every free (a double free, a freed context)."""
  alloc = _RejectingAllocator()

  @property
  def allocator(self): return _Buf.alloc


def test_a_failing_free_while_running_is_reported():
  b = _Buf("CPU", 4, dtypes.float32, opaque=123)
  with pytest.warns(FinalizerWarning, match=r"Buffer\.__del__.*OSError: driver rejected free\(123\)"):
    del b
    gc.collect()
  assert _Buf.alloc.calls[-1] == (123, 16)  # the free was attempted, with 4 float32s = 16 bytes


def test_the_rest_of_del_still_runs_after_a_reported_error():
  ran = []
  with pytest.warns(FinalizerWarning, match="first free failed: ValueError: boom"):
    with del_errors("first free"): raise ValueError("boom")
    ran.append("second free")
  assert ran == ["second free"]


def test_at_shutdown_an_error_is_silent(monkeypatch):
  monkeypatch.setattr(del_errors, "_finalizing", staticmethod(lambda: True))
  unraisable: list = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with del_errors("late free"): raise OSError("the driver is gone")
  assert caught == [] and unraisable == []


def test_a_buffer_freed_at_real_interpreter_exit_prints_nothing():
  script = textwrap.dedent("""
    from tiny_uop.device import Buffer
    from tiny_uop.dtype import dtypes
    class Bad:
      def free(self, *a): raise OSError("driver torn down")
    class B(Buffer):
      @property
      def allocator(self): return Bad()
    import sys
    sys.keep = B("CPU", 1, dtypes.int8, opaque=1)  # lives until the interpreter tears sys down
  """)
  r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and "FinalizerWarning" not in r.stderr and "OSError" not in r.stderr, r.stderr


def test_a_del_whose_module_globals_were_cleared_prints_nothing(monkeypatch):
  # at exit the interpreter sets module globals to None: a __del__ that looked `del_errors` up as a global then called
  # None ("Exception ignored in CLProgram.__del__ ... 'NoneType' object is not callable", seen at the end of a CI
  # session); bound as a default argument, with what it calls kept on its class, it still works
  monkeypatch.setattr(del_errors, "_finalizing", staticmethod(lambda: True))
  unraisable: list = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  ns: dict = {"del_errors": del_errors}
  exec(textwrap.dedent("""
    class Res:
      def __del__(self, _errors=del_errors):
        with _errors("Res.__del__"): raise OSError("driver torn down")
    class Old:
      def __del__(self):
        with del_errors("Old.__del__"): raise OSError("driver torn down")
  """), ns)
  res, old = ns["Res"](), ns["Old"]()
  ns["del_errors"] = None  # what module teardown does
  del res
  assert unraisable == []
  del old  # the global lookup: the failure this guards against
  assert len(unraisable) == 1 and isinstance(unraisable[0].exc_value, TypeError)
