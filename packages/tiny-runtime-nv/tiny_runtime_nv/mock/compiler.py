"""What the mock devices compile with, and how every PTX they run is still assembled by NVIDIA's ptxas.

- `MOCK+NV` needs cubins (the real loader reads them): NVIDIA's ptxas output with the kernel's PTX in one more ELF
  section, `.tiny.ptx`, which real loaders ignore and the mock GPU executes (`mock_renderers(cubin=True)`).
- `MOCK+CUDA` loads PTX text, as the CUDA driver does (it JIT-compiles PTX), so no ptxas run sits on the path of a
  kernel launch; instead `PtxasChecker` assembles every module the mock loads, many kernels per ptxas run, in a
  background thread. A rejected module raises CompileError (with ptxas's message) at the next synchronize, and at
  exit the process fails if any module was rejected after the last check.
The renderer classes keep their names (`DEV=MOCK+CUDA:PTX` / `:NVPTX` pick them).
"""
from __future__ import annotations

import atexit
import functools
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
from typing import Any

from tiny_uop.device import CompileError
from tiny_uop.helpers import cache_dir

from tiny_codegen.compiler.ptx import PTXCompiler, find_ptxas
from tiny_codegen.renderer import nvptx, ptx

from tiny_runtime_nv.elf import ELF, add_section

PTX_SECTION = ".tiny.ptx"


def with_ptx(lib: bytes, src: str) -> bytes:
  """The cubin `lib` with the PTX `src` in a `.tiny.ptx` section (PTX text stays as it is)."""
  return add_section(lib, PTX_SECTION, src.encode()) if lib.startswith(b"\x7fELF") else lib


def ptx_of(image: bytes) -> str:
  """The PTX a mock GPU executes for a loaded image: the `.tiny.ptx` section of a cubin, or PTX text."""
  if image.startswith(b"\x7fELF"):
    elf = ELF(image)
    if elf.section(PTX_SECTION) is None:
      raise ValueError("this cubin has no .tiny.ptx section: the mock GPU runs PTX, so compile with the mock "
                       "device's renderer (a cubin from plain ptxas carries only SASS)")
    return elf.data(PTX_SECTION).decode()
  return image.rstrip(b"\0").decode()


class MockPTXCompiler(PTXCompiler):
  """ptxas's cubin plus the PTX (`cubin`), or the PTX text (see the module docstring)."""

  def __init__(self, arch: str = "sm_90", cubin: bool = True):
    super().__init__(arch, use_ptxas=cubin)
    self.cachekey = f"mock_{self.cachekey}" if self.cachekey else None

  def compile(self, src: str) -> bytes: return with_ptx(super().compile(src), src)


class MockNVPTXCompiler(nvptx.NVPTXCompiler):
  """LLVM's PTX assembled by ptxas, plus that PTX (`cubin`), or the PTX text."""

  def __init__(self, arch: str = "sm_90", cubin: bool = True):
    super().__init__(arch)
    self.cubin = cubin
    self.cachekey = f"mock{int(cubin)}_{self.cachekey}" if self.cachekey else None

  def compile(self, src: str) -> bytes:
    text = self.to_ptx(src)
    return with_ptx(self.ptxas.compile(text), text) if self.cubin else text.encode()


def mock_renderers(cubin: bool) -> list[type]:
  """PTXRenderer and NVPTXRenderer (same names) whose compilers give what the mock device loads."""

  class PTXRenderer(ptx.PTXRenderer):
    """PTXRenderer compiling for a mock NVIDIA device (see tiny_runtime_nv.mock.compiler)."""
    def make_compiler(self) -> Any: return MockPTXCompiler(self.arch or "sm_90", cubin)

  class NVPTXRenderer(nvptx.NVPTXRenderer):
    """NVPTXRenderer compiling for a mock NVIDIA device (see tiny_runtime_nv.mock.compiler)."""
    def make_compiler(self) -> Any: return MockNVPTXCompiler(self.arch or "sm_90", cubin)
  return [PTXRenderer, NVPTXRenderer]


_ENTRY = re.compile(r"(\.entry\s+)([\w$]+)(\s*\()")
_HEADER = re.compile(r"^\s*\.(version|target|address_size)\b[^\n]*\n", re.M)


def _suffixed(m: re.Match[str], i: int) -> str:
  """An `.entry name(` renamed `name__m<i>(`: module `i`'s kernels keep distinct names in a joined batch."""
  return f"{m.group(1)}{m.group(2)}__m{i}{m.group(3)}"


class PtxasChecker:
  """Assembles PTX modules with ptxas in a background thread, up to `batch` kernels per ptxas run (modules with the
  same header are joined into one, their entries renamed apart); a rejected batch is retried module by module to
  name the culprit. `check()` raises CompileError for rejections so far; `drain()` waits for the queue."""

  def __init__(self, ptxas: str, batch: int = 64):
    self.ptxas, self.batch = ptxas, batch
    self.q: queue.Queue[tuple[str, str]] = queue.Queue()
    self.seen: set[int] = set()
    self.failures: list[str] = []
    self.checked = self.runs = 0
    self.idle = threading.Event()
    self.idle.set()
    threading.Thread(target=self._worker, daemon=True, name="ptxas-checker").start()

  def submit(self, ptx_text: str, arch: str) -> None:
    """Queue `ptx_text` (once per distinct module) to be assembled for `arch`."""
    h = hash(ptx_text)
    if h in self.seen: return
    self.seen.add(h)
    self.idle.clear()
    self.q.put((ptx_text, arch))

  def check(self) -> None:
    """Raise CompileError for the modules ptxas rejected since the last check."""
    if self.failures:
      msg, self.failures = "\n\n".join(self.failures), []
      raise CompileError(f"ptxas rejected PTX the mock GPU ran:\n{msg}")

  def drain(self, timeout: float = 600) -> None:
    """Wait until every queued module has been assembled; one not assembled by then is a failure (a check that
    didn't happen must not pass)."""
    if not self.idle.wait(timeout):
      self.failures.append(f"ptxas checker: queued modules not assembled after {timeout} s")

  SPAWN_TRIES = 3
  """ptxas runs tried per module: spawning it once failed with a transient EFAULT on a busy CI VM."""

  def _assemble(self, src: str, arch: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="ptxas_check_", dir=cache_dir()) as d:  # not /tmp: others clean it
      pth = os.path.join(d, "m.ptx")
      with open(pth, "w") as f: f.write(src)
      self.runs += 1
      cmd = [self.ptxas, f"-arch={arch}", "-O0", pth, "-o", os.path.join(d, "m.cubin")]
      for tries_left in range(self.SPAWN_TRIES - 1, -1, -1):
        try: p = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:  # ptxas didn't start (not a verdict on the PTX): again, then a failure naming why
          if tries_left: continue
          return f"could not run {self.ptxas}: {type(e).__name__}: {e}"
        return None if p.returncode == 0 else p.stderr.strip()
    raise AssertionError("unreachable: the loop returns")

  def _worker(self) -> None:
    while True:
      items = [self.q.get()]
      while len(items) < self.batch:
        try: items.append(self.q.get(timeout=0.2))
        except queue.Empty: break
      groups: dict[tuple[str, str], list[str]] = {}
      for text, arch in items:
        groups.setdefault(("".join(m.group(0) for m in _HEADER.finditer(text)), arch), []).append(text)
      for (header, arch), texts in groups.items():
        joined = header + "".join(_ENTRY.sub(functools.partial(_suffixed, i=i), _HEADER.sub("", t))
                                  for i, t in enumerate(texts))
        if len(texts) > 1 and self._assemble(joined, arch) is None: pass
        else:
          for t in texts:
            if (err := self._assemble(t, arch)) is not None:
              names = ", ".join(m.group(2) for m in _ENTRY.finditer(t))
              self.failures.append(f"ptxas -arch={arch} rejected kernel {names}: {err}")
        self.checked += len(texts)
      if self.q.empty(): self.idle.set()


_CHECKER: PtxasChecker | None = None


def ptxas_checker() -> PtxasChecker | None:
  """The process's checker (None without ptxas); at exit it drains and fails the process on rejections."""
  global _CHECKER
  if _CHECKER is None and (p := find_ptxas()) is not None:
    _CHECKER = PtxasChecker(p)
    atexit.register(_final_check)
  return _CHECKER


def _final_check() -> None:
  if _CHECKER is None: return
  _CHECKER.drain()
  if _CHECKER.failures:
    print("\n".join(["tiny MOCK+CUDA: ptxas rejected PTX that ran:", *_CHECKER.failures]), file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)
