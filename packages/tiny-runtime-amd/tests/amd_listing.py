"""Test helper: the emulator's decoder against LLVM's own assembly listing of the same code object."""
from __future__ import annotations

import re
from typing import Any


def check_decode_matches_assembly(spec: Any, arch: str = "gfx1100") -> None:
  """Every instruction of `spec`'s code object (an AMDGPU ProgramSpec) decodes to the mnemonic LLVM's listing has,
  in order (VOPD pairs as their two `v_dual_*` halves; `_e32`/`_e64` suffixes aside). gfx9 archs use the CDNA3
  decoder."""
  from tiny_codegen.compiler.amdgpu import AMDGPUCompiler
  from tiny_runtime_amd.elf import ELF
  from tiny_runtime_amd.emu.cdna3 import decode9
  from tiny_runtime_amd.emu.rdna3 import decode as decode11
  decode = decode9 if arch.startswith("gfx9") else decode11
  asm = AMDGPUCompiler(arch).assembly(spec.src)
  want = []
  for line in asm[asm.index(f"{spec.name}:\n"):asm.index("s_endpgm")].splitlines()[1:]:
    line = line.split(";")[0].strip()
    if line and not line.startswith(".") and not line.endswith(":"):
      want += re.findall(r"v_dual_\w+", line) or [line.split()[0]]
  elf = ELF.parse(spec.lib)
  _, off, kd = elf.kernel()
  img, pc, got = elf.image(), off + kd.kernel_code_entry_byte_offset, []
  while (inst := decode(img, pc)).name != "s_endpgm":
    got += inst.name.split(" :: ")
    pc += inst.size

  def norm(n: str) -> str: return re.sub(r"_e(32|64)$", "", n)
  assert [norm(n) for n in got] == [norm(n) for n in want]
