"""tiny-codegen's packaging: installed, renderers registered in the tiny.renderers entry-point group."""
import importlib.metadata


def test_installed():
  assert importlib.metadata.version("tiny-codegen") == "0.1.0"
  import tiny_codegen  # noqa: F401


def test_renderers_registered():
  eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="tiny.renderers")}
  assert eps.get("C") == "tiny_codegen.renderer.cstyle:ClangRenderer"
  assert eps.get("LLVM") == "tiny_codegen.renderer.llvmir:LLVMRenderer"


def test_never_imports_tensor_or_runtimes():
  """docs/ARCHITECTURE.md §1: tiny-codegen must never import tiny-tensor or a runtime."""
  import subprocess
  import sys
  code = ("import sys, pkgutil, importlib, tiny_codegen\n"
          "for m in pkgutil.walk_packages(tiny_codegen.__path__, 'tiny_codegen.'):\n"
          "  try: importlib.import_module(m.name)\n"
          "  except Exception: pass  # a module that fails to import is its own tests' business\n"
          "print(sorted(m for m in sys.modules if m.startswith(('tiny_tensor', 'tiny_runtime'))))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
