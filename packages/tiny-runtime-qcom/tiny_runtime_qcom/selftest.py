"""Hardware check for a machine with an Adreno GPU: `python -m tiny_runtime_qcom.selftest` (from the source tree:
`PYTHONPATH=packages/tiny-uop:packages/tiny-codegen:packages/tiny-runtime-cpu:packages/tiny-runtime-qcom:`
`packages/tiny-tensor python -m tiny_runtime_qcom.selftest`; this process never imports tiny-tensor).

1. driver and GPU info: /dev/kgsl-3d0 and the GPU KGSL reports (chip id, Adreno version, GMEM);
2. on the QCOM device (one that can't open says why): kernels built from UOps by tiny-codegen, compiled by the
   device's OpenCL compiler and launched through the device API with a6xx command streams, against numpy
   (elementwise, a row reduction, an fp16 matmul with float accumulation), and a host -> device -> host copy;
3. when tiny-tensor is installed, its conformance suite on the device in a child process (`python -m
   tiny_tensor.conformance --device QCOM --speed ...`).
Exit status 0 when every check passed, 1 when one failed, 2 when there is no Adreno GPU (said at once, with why).
`--mock` runs steps 2-3 on MOCK+QCOM (the mock KGSL and an a630 running kernels on PoCL) with small sizes (what the
unit test does); `--quick` shrinks the sizes; `--no-tensor` skips step 3. The checks compare against numpy, which this
package does not otherwise need (`pip install numpy`; without it the run stops with exit status 1 and says so).
The steps, the checks and the exit status are tiny-uop's shared selftest (`tiny_uop.plugins.selftest`, which
imports numpy only when the checks run); this module says what is QCOM's: the KGSL probe, the mock, how the device
describes itself.
"""
from __future__ import annotations

import sys
from typing import Any

from tiny_uop.plugins import selftest

DEVICES = {"QCOM": "tiny_runtime_qcom.device:QCOMDevice"}  # MOCK+QCOM too


def probe() -> tuple[list[str], list[str], list[str]]:
  """(info lines, reasons there is no usable Adreno GPU, the devices to check) without opening the device."""
  from tiny_runtime_qcom import kgsl
  from tiny_uop.hcq import FileIOInterface
  if not FileIOInterface.exists(kgsl.KGSL_PATH):
    return [], [f"{kgsl.KGSL_PATH} missing (no KGSL driver: not an Adreno machine, or no access from this user)"], []
  try: k = kgsl.KGSLIface()
  except (RuntimeError, OSError) as e: return [f"KGSL: {kgsl.KGSL_PATH} present"], [str(e)], []
  i = k.info
  return [f"KGSL: Adreno {i.arch} (chip id {i.chip_id:#010x}, GMEM {i.gmem_bytes >> 10} KiB)"], [], ["QCOM"]


def describe(dev: str, d: Any) -> str:
  """The GPU KGSL reports and the renderer the device picked."""
  info = d.kgsl.info
  return f"Adreno {info.arch} (chip id {info.chip_id:#010x}), renderer {type(d.renderer).__name__}"


def _get_program(ast: Any, renderer: Any) -> Any:
  from tiny_codegen import get_program
  return get_program(ast, renderer)


SPEC = selftest.SelfTest(gpu="Adreno GPU", devices=DEVICES, probe=probe, mock_devices=lambda: ["MOCK+QCOM"],
                         describe=describe, get_program=_get_program)


def main(argv: list[str]) -> int:
  """Run the checks (see the module docstring); the exit status."""
  return selftest.main(SPEC, argv)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
