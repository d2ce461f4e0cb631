"""Every runtime `__del__` that frees device memory reports a failing free while the interpreter runs (each used to
swallow every exception). The objects are made without their constructors: only the fields `__del__` reads."""
from __future__ import annotations

import gc

import pytest

from tiny_uop.helpers import FinalizerWarning


class _Dev:
  """A device whose frees fail, as after a double free or with the driver gone."""
  timeline_value = 3

  def defer_free(self, buf, after): raise RuntimeError(f"defer_free({buf!r}, {after}) on a closed device")


class _Lib:
  def __getattr__(self, name):
    def fail(*args): raise RuntimeError(f"{name}{args} failed")
    return fail


def _nv_program():
  from tiny_runtime_nv.device import NVProgram
  p = object.__new__(NVProgram)
  p.dev, p.image = _Dev(), "image"
  return p, r"NVProgram\.__del__.*defer_free\('image', 2\)"


def _cuda_program():
  from tiny_runtime_nv.cuda import CUDAProgram
  p = object.__new__(CUDAProgram)
  p.dev = type("D", (), {"drv": type("Drv", (), {"lib": _Lib()})()})()
  p.module = 7
  return p, r"CUDAProgram\.__del__.*cuModuleUnload\(7,\) failed"


def _qcom_program():
  from tiny_runtime_qcom.device import QCOMProgram
  p = object.__new__(QCOMProgram)
  p.dev, p.lib_buf = _Dev(), "lib"
  return p, r"QCOMProgram\.__del__.*defer_free\('lib', 2\)"


def _cl_buf():
  from tiny_runtime_qcom.cl import CLBuf
  return CLBuf(_Lib(), "mem", 64, base=object()), r"CLBuf\.__del__.*clReleaseMemObject\('mem',\) failed"


def _cl_program():
  from tiny_runtime_qcom.cl import CLProgram
  p = object.__new__(CLProgram)
  p.dev = type("D", (), {"cl": _Lib()})()
  p.name, p.kernel, p.prg = "E_4", "k", "p"
  return p, r"CLProgram\.__del__ \(E_4\).*clReleaseKernel\('k',\) failed"


@pytest.mark.parametrize("make", [_nv_program, _cuda_program, _qcom_program, _cl_buf, _cl_program])
def test_a_failing_free_in_a_runtime_del_is_reported(make):
  obj, pattern = make()
  with pytest.warns(FinalizerWarning, match=pattern):
    del obj
    gc.collect()
