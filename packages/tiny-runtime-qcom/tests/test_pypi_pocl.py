"""PoCL from PyPI (pocl-binary-distribution, a test dependency) through its ICD dispatch table: the table order we
call by (Khronos CL/cl_icd.h, `cl.ICD_ORDER`) against the PoCL library's own symbol table, and tensors computed on it
against numpy -- also on a machine whose system OpenCL would otherwise be used."""
from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

from tiny_runtime_qcom import cl


def _pocl() -> str:
  path = cl.pypi_pocl()
  assert path is not None, "pocl-binary-distribution (a test dependency, noxfile.py TOOL_DEPS) is not installed"
  return path


def test_dispatch_table_order_is_pocls():
  """Each dispatch-table slot we name holds PoCL's function of that name: its implementation `POcl<Name>` (found in the
  library's .symtab with pyelftools, relocated by an exported one) -- every slot of ICD_ORDER PoCL implements."""
  from elftools.elf.elffile import ELFFile
  path = _pocl()
  with open(path, "rb") as f:
    symtab = ELFFile(f).get_section_by_name(".symtab")
    syms = {s.name: s["st_value"] for s in symtab.iter_symbols() if s.name.startswith("POcl")}
  lib = ctypes.CDLL(path)
  base = ctypes.cast(lib.POclRetainEvent, ctypes.c_void_p).value - syms["POclRetainEvent"]  # an exported symbol
  table = cl.ICD(path).table
  checked = [name for name in cl.ICD_ORDER if "POcl" + name[2:] in syms]
  assert set(cl.SIGS) <= set(checked) and len(checked) > 80, checked
  for name in checked:
    assert table[cl.ICD_ORDER.index(name)] == base + syms["POcl" + name[2:]], name


def test_tensors_on_pypi_pocl():
  """A fresh process whose CL device is forced onto the PyPI PoCL (the system's libOpenCL, if any, is not used)."""
  code = textwrap.dedent(f"""
    import numpy as np
    from tiny_runtime_qcom import cl
    icd = cl.ICD({_pocl()!r})
    cl.libcl = lambda: icd
    from tiny_tensor import Tensor
    a = np.arange(-8, 24, dtype=np.float32).reshape(4, 8) / 3
    t = Tensor(a, device="CL")
    np.testing.assert_allclose((t * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose((t @ t.T).numpy(), a.astype(np.float64) @ a.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t.exp().sum(1).numpy(), np.exp(a.astype(np.float64)).sum(1), rtol=1e-5)
    from tiny_uop.plugins import Device
    assert type(cl.libcl()) is cl.ICD and Device["CL"].device_name, Device["CL"].device_name
    print("ok", Device["CL"].device_name)
  """)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
