"""The external tools tiny runs (a C compiler, clang, ld.lld, ptxas, ...), found through one function: `find_tool`.

A tool is looked up, in order: in its environment variable (``$CC``, ``$LD_LLD``, ...: a path or a command line),
on ``PATH`` (plain and versioned names), then inside an installed Python package that bundles it, so that
``pip install`` alone is enough to get every tool the tests use:

- ``cc`` (``$CC``): clang, cc or gcc on PATH; else ``zig cc`` from ``pip install ziglang`` (clang with libc headers).
- ``clang`` (``$CLANG``): clang, clang-20 ... clang-14; else ``zig clang`` (ziglang: the clang driver itself).
- ``ld.lld`` (``$LD_LLD``): ld.lld, ld.lld-20 ... ld.lld-14; else ``zig ld.lld`` (ziglang).
- ``ptxas`` (``$PTXAS``): ptxas, /usr/local/cuda/bin/ptxas; else ``bin/ptxas`` of ``pip install nvidia-cuda-nvcc``
  (or ``nvidia-cuda-nvcc-cu12``).

`find_tool` returns the command line to run it (a list: ``["/usr/bin/ld.lld"]`` or ``[".../ziglang/zig",
"ld.lld"]``), or None. `tool_status` says where each tool was found, or how to get it. Pure standard library.

>>> find_tool("ld.lld")                                   # doctest: +SKIP
['/usr/bin/ld.lld']
"""
from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
from dataclasses import dataclass

__all__ = ["Tool", "TOOLS", "find_tool", "tool_status", "register_tool"]


@dataclass(frozen=True)
class Bundled:
  """A tool inside an installed distribution: the file (relative to its site-packages folder) and extra arguments
  that select the tool when the file is a multi-tool driver (``zig cc``)."""
  dist: str                       # distribution name on PyPI ("ziglang")
  paths: tuple[str, ...]          # candidate files relative to site-packages, first existing one wins
  args: tuple[str, ...] = ()      # arguments after the file ("cc")


@dataclass(frozen=True)
class Tool:
  """How to find one tool: an environment variable, names on PATH (or absolute paths), and bundling packages."""
  name: str
  env: str | None
  path_names: tuple[str, ...]
  bundled: tuple[Bundled, ...] = ()

  def pip_hint(self) -> str:
    return " or ".join(f"pip install {b.dist}" for b in dict.fromkeys(self.bundled)) or "install it"


def _versioned(name: str) -> tuple[str, ...]: return (name, *(f"{name}-{v}" for v in range(20, 13, -1)))


_ZIG = ("ziglang/zig",)
_PTXAS = ("nvidia/cu13/bin/ptxas", "nvidia/cuda_nvcc/bin/ptxas")
TOOLS: dict[str, Tool] = {t.name: t for t in (
  Tool("cc", "CC", ("clang", "cc", "gcc"), (Bundled("ziglang", _ZIG, ("cc",)),)),
  Tool("clang", "CLANG", _versioned("clang"), (Bundled("ziglang", _ZIG, ("clang",)),)),
  Tool("ld.lld", "LD_LLD", _versioned("ld.lld"), (Bundled("ziglang", _ZIG, ("ld.lld",)),)),
  Tool("ptxas", "PTXAS", ("ptxas", "/usr/local/cuda/bin/ptxas"),
       (Bundled("nvidia-cuda-nvcc", _PTXAS), Bundled("nvidia-cuda-nvcc-cu12", _PTXAS))),
)}


def register_tool(tool: Tool) -> None:
  """Add or replace a tool description (a runtime package with a tool of its own)."""
  TOOLS[tool.name] = tool


def _executable(p: str) -> str | None:
  if os.sep in p: return p if os.path.isfile(p) and os.access(p, os.X_OK) else None
  return shutil.which(p)


def _bundled(b: Bundled) -> list[str] | None:
  try: dist = importlib.metadata.distribution(b.dist)
  except importlib.metadata.PackageNotFoundError: return None
  for rel in b.paths:
    if (p := _executable(str(dist.locate_file(rel)))) is not None: return [p, *b.args]
  return None


def find_tool(name: str, registry: bool = True) -> list[str] | None:
  """The command line that runs tool `name` (see the module table), or None when it is nowhere to be found.

  `registry=False` looks only at the environment variable and PATH (not inside installed packages)."""
  if (tool := TOOLS.get(name)) is None:
    raise ValueError(f"unknown tool {name!r}; known: {', '.join(TOOLS)} (tiny_uop.tools.register_tool adds one)")
  if tool.env and (val := os.environ.get(tool.env, "").strip()):
    cmd = shlex.split(val)
    if cmd and (exe := _executable(cmd[0])) is not None: return [exe, *cmd[1:]]
  for n in tool.path_names:
    if (exe := _executable(n)) is not None: return [exe]
  if registry:
    for b in tool.bundled:
      if (found := _bundled(b)) is not None: return found
  return None


def tool_status(name: str) -> str:
  """One line: where tool `name` was found, or how to get it."""
  tool = TOOLS[name]
  if (cmd := find_tool(name)) is not None: return f"{name}: {' '.join(cmd)}"
  where = f"${tool.env}, " if tool.env else ""
  return f"{name}: not found ({where}PATH: {', '.join(tool.path_names[:3])}); {tool.pip_hint()}"
