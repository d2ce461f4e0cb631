"""The monorepo's packaging contract (docs/ARCHITECTURE.md §1): versions, sibling ranges, the dependency table,
py.typed, and the metadata a wheel shows (license, classifiers, URLs)."""
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIBLING = {"tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "tiny-runtime-amd", "tiny-runtime-nv", "tiny-runtime-qcom",
           "tiny-tensor", "tiny-torch"}
# package -> its dependencies (names only), as in docs/ARCHITECTURE.md §1; arrows only point down this table
DEPS = {
  "tiny-uop": set(),
  "tiny-codegen": {"tiny-uop", "llvmlite"},
  "tiny-runtime-cpu": {"tiny-uop", "tiny-codegen"},
  "tiny-runtime-amd": {"tiny-uop", "tiny-codegen", "cffi", "numpy"},  # numpy: the MOCK+AMD emulator (emu/batch.py)
  "tiny-runtime-nv": {"tiny-uop", "tiny-codegen", "cffi", "numpy"},  # numpy: the PTX executor (MOCK+CUDA), selftest
  "tiny-runtime-qcom": {"tiny-uop", "tiny-codegen", "cffi"},
  "tiny-tensor": {"tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "numpy"},
  "tiny-torch": {"tiny-tensor", "torch", "numpy"},  # PyTorch's `tiny` device and torch.compile backend
}
ENTRY_POINTS = {
  "tiny-codegen": {"tiny.renderers": {"C": "tiny_codegen.renderer.cstyle:ClangRenderer",
                                      "LLVM": "tiny_codegen.renderer.llvmir:LLVMRenderer",
                                      "PTX": "tiny_codegen.renderer.ptx:PTXRenderer",
                                      "NVPTX": "tiny_codegen.renderer.nvptx:NVPTXRenderer",
                                      "AMDGPU": "tiny_codegen.renderer.amdgpu:AMDGPURenderer",
                                      "OPENCL": "tiny_codegen.renderer.opencl:OpenCLRenderer"}},
  "tiny-runtime-cpu": {"tiny.devices": {d: f"tiny_runtime_cpu:{d}_PLUGIN" for d in ("CPU", "PYTHON", "NULL", "DISK")}},
  "tiny-runtime-amd": {"tiny.devices": {"AMD": "tiny_runtime_amd:plugin"}},
  "tiny-runtime-nv": {"tiny.devices": {"NV": "tiny_runtime_nv:NV_PLUGIN", "CUDA": "tiny_runtime_nv:CUDA_PLUGIN"}},
  "tiny-runtime-qcom": {"tiny.devices": {"QCOM": "tiny_runtime_qcom:QCOM_PLUGIN", "CL": "tiny_runtime_qcom:CL_PLUGIN"}},
  "tiny-torch": {"torch_dynamo_backends": {"tiny": "tiny_torch.dynamo:tiny_backend"}},
}


def _pyproject(pkg: str) -> dict:
  return tomllib.loads((ROOT / "packages" / pkg / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
  assert {p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()} == SIBLING


@pytest.mark.parametrize("pkg", sorted(SIBLING))
def test_pyproject(pkg):
  meta = _pyproject(pkg)
  proj = meta["project"]
  mod = pkg.replace("-", "_")
  assert proj["name"] == pkg and proj["dynamic"] == ["version"] and "version" not in proj
  assert meta["tool"]["hatch"]["version"] == {"path": f"{mod}/__init__.py"}  # the one place the version is written
  assert meta["build-system"]["build-backend"] == "hatchling.build"
  assert meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [mod]
  assert (ROOT / "packages" / pkg / proj["readme"]).is_file()
  assert (ROOT / "packages" / pkg / mod / "py.typed").is_file()
  names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in proj.get("dependencies", [])}
  assert names == DEPS[pkg]
  for dep in proj.get("dependencies", []):
    if dep.split(">")[0] in SIBLING: assert dep.endswith(">=0.1,<0.2"), f"{pkg}: sibling dependency {dep!r} is no range"
  eps = proj.get("entry-points", {})
  assert eps == ENTRY_POINTS.get(pkg, {})
  # what PyPI shows: license (with its text in the wheel), classifiers, URLs
  assert proj["license"] == "MIT" and proj["license-files"] == ["LICENSE"]
  assert (ROOT / "packages" / pkg / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
  assert "Typing :: Typed" in proj["classifiers"] and "Programming Language :: Python :: 3.11" in proj["classifiers"]
  assert not [c for c in proj["classifiers"] if c.startswith("License ::")], "PEP 639: the license field says it"
  assert set(proj["urls"]) == {"Homepage", "Documentation", "Repository", "Changelog", "Source"}
  assert proj["urls"]["Documentation"].endswith("/docs/ARCHITECTURE.md")
  assert proj["urls"]["Source"].endswith(f"/packages/{pkg}")


def _init_version(pkg: str) -> str:
  init = (ROOT / "packages" / pkg / pkg.replace("-", "_") / "__init__.py").read_text()
  m = re.search(r'^__version__ = "([^"]+)"', init, re.M)
  assert m, f"{pkg}: no __version__ line in its __init__.py"
  return m.group(1)


@pytest.mark.parametrize("pkg", sorted(SIBLING))
def test_version_from_one_place(pkg):
  """__version__ is written once, in the package's __init__.py: the installed metadata and the import agree."""
  import importlib
  assert _init_version(pkg) == "0.1.0"
  assert importlib.import_module(pkg.replace("-", "_")).__version__ == _init_version(pkg)


@pytest.mark.parametrize("pkg", sorted(SIBLING))
def test_installed_metadata_matches(pkg):
  """The environment runs what this checkout declares (editable installs are up to date)."""
  try: dist = importlib.metadata.distribution(pkg)
  except importlib.metadata.PackageNotFoundError: pytest.fail(f"{pkg} is not installed; run the tests through nox")
  assert dist.version == _init_version(pkg)
  got = {(ep.group, ep.name, ep.value) for ep in dist.entry_points if ep.group.startswith("tiny.")}
  declared = _pyproject(pkg)["project"].get("entry-points", {})
  want = {(g, n, v) for g, d in declared.items() if g.startswith("tiny.") for n, v in d.items()}
  assert got == want, f"{pkg}'s installed entry points are stale: reinstall it (nox does this when pyproject changes)"


@pytest.mark.parametrize("name, target", sorted(ENTRY_POINTS["tiny-codegen"]["tiny.renderers"].items()))
def test_renderer_entry_points_load(name, target):
  """Every registered renderer imports and is a Renderer with a compiler."""
  import importlib
  from tiny_uop.device import Renderer
  mod, _, attr = target.partition(":")
  cls = getattr(importlib.import_module(mod), attr)
  assert issubclass(cls, Renderer), f"{name} -> {target} is not a Renderer"
  assert cls().compiler is not None
