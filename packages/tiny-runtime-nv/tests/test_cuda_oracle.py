"""Independent truth for the CUDA driver's facts: every constant and every function signature `tiny_runtime_nv.cuda_api`
encodes, against tinygrad 0.14.0's bindings generated from cuda.h (`tinygrad/runtime/autogen/cuda.py`, a test-only
dependency), so a mistyped value or a swapped argument can't hide behind a mock written from the same reading."""
from __future__ import annotations

import inspect
import re

import tinygrad.runtime.autogen.cuda as tg  # tinygrad==0.14.0: a test dependency (noxfile), never skipped

from tiny_runtime_nv import cuda_api


def test_error_codes_match_cuda_h():
  ours = {k: v for k, v in vars(cuda_api).items() if k.startswith("CUDA_ERROR_") or k == "CUDA_SUCCESS"}
  assert len(ours) >= 15
  for name, v in ours.items(): assert getattr(tg, name) == v, name


def test_attributes_match_cuda_h():
  pairs = {"ATTR_MAX_THREADS_PER_BLOCK": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
           "ATTR_MULTIPROCESSOR_COUNT": "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
           "ATTR_COMPUTE_CAPABILITY_MAJOR": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
           "ATTR_COMPUTE_CAPABILITY_MINOR": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
           "ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
           "FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES": "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
           "JIT_TARGET": "CU_JIT_TARGET", "JIT_INPUT_PTX": "CU_JIT_INPUT_PTX"}
  for ours, theirs in pairs.items(): assert getattr(cuda_api, ours) == getattr(tg, theirs), ours


def test_function_signatures_match_cuda_h():
  funcs = re.findall(r"CUresult (\w+)\((.*?)\);", cuda_api.CDEF.replace("\n", " "))
  assert len(funcs) >= 30
  for name, params in funcs:
    ours = [p.strip().split()[-1].lstrip("*") for p in params.split(",")] if params.strip() != "void" else []
    theirs = list(inspect.signature(getattr(tg, name)).parameters)
    assert ours == theirs, f"{name}: ours {ours}, cuda.h {theirs}"
