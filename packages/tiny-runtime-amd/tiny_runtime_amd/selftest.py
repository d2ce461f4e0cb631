"""Hardware check for a machine with an AMD GPU: `python -m tiny_runtime_amd.selftest` (from the source tree:
`PYTHONPATH=packages/tiny-uop:packages/tiny-codegen:packages/tiny-runtime-cpu:packages/tiny-runtime-amd:`
`packages/tiny-tensor python -m tiny_runtime_amd.selftest`; this process never imports tiny-tensor).

1. driver and GPU info: /dev/kfd, and every GPU node of the KFD topology (LLVM target, CUs, XCCs, render node);
2. on each AMD device that opens (`AMD:n`; one that can't open says why): kernels built from UOps by tiny-codegen,
   compiled for the GPU's target and launched through the device API, against numpy (elementwise, a row reduction, an
   fp16 matmul with float accumulation), and a host -> device -> host copy through the SDMA queue;
3. when tiny-tensor is installed, its conformance suite on the device in a child process (`python -m
   tiny_tensor.conformance --device AMD --speed ...`), next to torch on cuda (ROCm's torch) when installed.
Exit status 0 when every check passed, 1 when one failed, 2 when there is no AMD GPU (said at once, with why).
`--mock` runs steps 2-3 on MOCK+AMD (gfx1100, the RDNA3 emulator; with `DEV=MOCK+AMD:LLVM:gfx942`, the mocked MI300
and the CDNA3 emulator: the arch is a process-wide choice) with small sizes (what the unit test does); `--quick`
shrinks the sizes; `--no-tensor` skips step 3. Compiling needs LLVM's AMDGPU backend (llvmlite) and ld.lld.
The steps, the checks and the exit status are tiny-uop's shared selftest (`tiny_uop.plugins.selftest`); this module
says what is AMD's: the KFD probe, the mocked GPUs, how a device describes itself.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from tiny_uop.plugins import selftest

DEVICES = {"AMD": "tiny_runtime_amd.device:AMDDevice"}  # MOCK+AMD too


def probe() -> tuple[list[str], list[str], list[str]]:
  """(info lines, reasons there is no usable AMD GPU, the devices `AMD:n` to check) without opening a device."""
  from tiny_runtime_amd import kfd
  from tiny_uop.hcq import FileIOInterface
  info: list[str] = []
  missing: list[str] = []
  if not FileIOInterface.exists(kfd.KFD_PATH):
    missing.append(f"{kfd.KFD_PATH} missing (the amdgpu kernel driver with KFD is not loaded)")
    return info, missing, []
  info.append(f"KFD: {kfd.KFD_PATH} present")
  nodes = kfd.gpu_nodes()
  for n in nodes:
    info.append(f"  node {n.node}: {n.arch}, {n.cu_count} CUs, {n.num_xcc} XCC(s), gpu_id {n.gpu_id:#x}, "
                f"render node /dev/dri/renderD{n.drm_render_minor}")
  if not nodes: missing.append(f"the KFD topology ({kfd.TOPOLOGY}) lists no GPU node")
  return info, missing, [f"AMD:{i}" for i in range(len(nodes))]


def mock_devices() -> list[str]:
  """DEV picks the mocked GPUs' arch for the whole process (MOCK+AMD:LLVM:gfx942: MI300s); MOCK+AMD otherwise."""
  dev_env = os.environ.get("DEV", "")
  return [dev_env if dev_env.startswith("MOCK+AMD") else "MOCK+AMD"]


def describe(dev: str, d: Any) -> str:
  """The opened device's GPU node: arch, CUs, XCCs, wave size."""
  node = d.iface.node
  return f"{node.arch}, {node.cu_count} CUs, {node.num_xcc} XCC(s), wave{d.wave_size}"


def _get_program(ast: Any, renderer: Any) -> Any:
  from tiny_codegen import get_program
  return get_program(ast, renderer)


SPEC = selftest.SelfTest(gpu="AMD GPU", devices=DEVICES, probe=probe, mock_devices=mock_devices, describe=describe,
                         get_program=_get_program, torch="cuda")


def main(argv: list[str]) -> int:
  """Run the checks (see the module docstring); the exit status."""
  return selftest.main(SPEC, argv)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
