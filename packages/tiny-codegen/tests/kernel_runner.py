"""Test helper: run a compiled kernel (ProgramSpec) on numpy arrays without a runtime.

LLVM objects (ELF relocatable) load into a fresh llvmlite MCJIT engine; shared objects (clang) load with ctypes.
Tests import it by name (conftest.py puts this folder on sys.path).
"""
from __future__ import annotations

import ctypes
import os
import struct
import tempfile
import threading
from typing import Any

import numpy as np

_engines: list[Any] = []  # keep engines alive: their code must outlive the call
_dlls: list[Any] = []


def load_fn(name: str, lib: bytes) -> int:
  """Address of function `name` in an ELF object (MCJIT) or shared object (dlopen)."""
  e_type = struct.unpack_from("<H", lib, 16)[0]
  if e_type == 1:
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine()
    eng = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    eng.add_object_file(llvm.ObjectFileRef.from_data(lib))
    eng.finalize_object()
    _engines.append(eng)
    return eng.get_function_address(name)
  fd, path = tempfile.mkstemp(suffix=".so")
  with os.fdopen(fd, "wb") as f: f.write(lib)
  dll = ctypes.CDLL(path)
  os.unlink(path)
  _dlls.append(dll)
  return ctypes.cast(getattr(dll, name), ctypes.c_void_p).value or 0


def run(spec: Any, bufs: list[np.ndarray], vals: tuple[int, ...] = (), threaded: bool = False) -> None:
  """Call the kernel once per core_id in range(global_size[0]) on `bufs` (by PARAM slot) and `vals` (by spec.vars)."""
  addr = load_fn(spec.name, spec.lib)
  nbufs = len(spec.globals)
  fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs), *([ctypes.c_int32] * (len(vals) + 1)))(addr)
  args = [bufs[slot].ctypes.data for slot in spec.globals]
  n = spec.global_size[0]
  if threaded and n > 1:
    ts = [threading.Thread(target=fn, args=(*args, *vals, i)) for i in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
  else:
    for i in range(n): fn(*args, *vals, i)
