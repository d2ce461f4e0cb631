"""OpenCL through cffi: the API subset tiny uses, and where it comes from (`load`).

Signatures are those of Khronos `CL/cl.h` (OpenCL 2.0; `cl_int` = int32, `cl_uint` = uint32, bitfields uint64,
objects opaque pointers). An implementation is found in this order:

1. `TINY_OPENCL_ICD=/path/libvendor.so`: that vendor library, used as an ICD (below);
2. the system's `libOpenCL` (an ICD loader such as ocl-icd, or a vendor library such as Adreno's, which Android keeps
   in /vendor/lib64), called by its exported names;
3. PoCL from PyPI (`pip install pocl-binary-distribution`, a test dependency): its library only exports the ICD entry
   points, so it is called the way an ICD loader calls it -- `clIcdGetPlatformIDsKHR` (found with
   `clGetExtensionFunctionAddress`) gives the platforms, and every OpenCL object starts with a pointer to the
   vendor's dispatch table, `struct _cl_icd_dispatch` of Khronos `CL/cl_icd.h`, whose member order is the ICD ABI.

PoCL from PyPI compiles a kernel with the clang inside its library, then links it into a shared object by running
the system linker ``ld`` with gcc's ``libgcc`` (`-lgcc -lgcc_s`), found by that clang driver on ``COMPILER_PATH`` and
``PATH``. On a machine without binutils and gcc that link fails and PoCL aborts the whole process. `pocl_linker`
checks first: where ``ld`` or libgcc is missing it points ``COMPILER_PATH`` at an ``ld`` that runs ``ld.lld`` from
PyPI (``pip install ziglang``; `tiny_uop.tools.find_tool`) without the libgcc libraries (a kernel calls no libgcc
function: PoCL's kernel library brings its builtins), and with no ``ld.lld`` either it raises `OpenCLUnavailable`
saying what to install, before PoCL can abort.

`load()` returns an `OpenCL` whose attributes are the API functions (`cl.clGetPlatformIDs(...)`) whichever way it was
found; `OpenCLUnavailable` (an OSError) says why none was.
"""
from __future__ import annotations

import ctypes.util
import functools
import glob
import hashlib
import importlib.util
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import cffi

ffi = cffi.FFI()

# name: (return type, parameters), as declared in Khronos CL/cl.h
API: dict[str, tuple[str, str]] = {
  "clGetPlatformIDs": ("cl_int", "cl_uint, cl_platform_id*, cl_uint*"),
  "clGetPlatformInfo": ("cl_int", "cl_platform_id, cl_uint, size_t, void*, size_t*"),
  "clGetDeviceIDs": ("cl_int", "cl_platform_id, cl_ulong, cl_uint, cl_device_id*, cl_uint*"),
  "clGetDeviceInfo": ("cl_int", "cl_device_id, cl_uint, size_t, void*, size_t*"),
  "clCreateContext": ("cl_context", "const intptr_t*, cl_uint, const cl_device_id*, void*, void*, cl_int*"),
  "clReleaseContext": ("cl_int", "cl_context"),
  "clCreateCommandQueue": ("cl_command_queue", "cl_context, cl_device_id, cl_ulong, cl_int*"),
  "clReleaseCommandQueue": ("cl_int", "cl_command_queue"),
  "clCreateBuffer": ("cl_mem", "cl_context, cl_ulong, size_t, void*, cl_int*"),
  "clReleaseMemObject": ("cl_int", "cl_mem"),
  "clCreateProgramWithSource": ("cl_program", "cl_context, cl_uint, const char**, const size_t*, cl_int*"),
  "clReleaseProgram": ("cl_int", "cl_program"),
  "clBuildProgram": ("cl_int", "cl_program, cl_uint, const cl_device_id*, const char*, void*, void*"),
  "clGetProgramInfo": ("cl_int", "cl_program, cl_uint, size_t, void*, size_t*"),
  "clGetProgramBuildInfo": ("cl_int", "cl_program, cl_device_id, cl_uint, size_t, void*, size_t*"),
  "clCreateKernel": ("cl_kernel", "cl_program, const char*, cl_int*"),
  "clReleaseKernel": ("cl_int", "cl_kernel"),
  "clSetKernelArg": ("cl_int", "cl_kernel, cl_uint, size_t, const void*"),
  "clFinish": ("cl_int", "cl_command_queue"),
  "clEnqueueReadBuffer": ("cl_int", "cl_command_queue, cl_mem, cl_uint, size_t, size_t, void*, cl_uint, void*, "
                                    "void*"),
  "clEnqueueWriteBuffer": ("cl_int", "cl_command_queue, cl_mem, cl_uint, size_t, size_t, const void*, cl_uint, "
                                     "void*, void*"),
  "clEnqueueCopyBuffer": ("cl_int", "cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, void*, void*"),
  "clEnqueueReadImage": ("cl_int", "cl_command_queue, cl_mem, cl_uint, const size_t*, const size_t*, size_t, size_t, "
                                   "void*, cl_uint, void*, void*"),
  "clEnqueueCopyBufferToImage": ("cl_int", "cl_command_queue, cl_mem, cl_mem, size_t, const size_t*, const size_t*, "
                                           "cl_uint, void*, void*"),
  "clEnqueueMapBuffer": ("void*", "cl_command_queue, cl_mem, cl_uint, cl_ulong, size_t, size_t, cl_uint, void*, "
                                  "void*, cl_int*"),
  "clEnqueueUnmapMemObject": ("cl_int", "cl_command_queue, cl_mem, void*, cl_uint, void*, void*"),
  "clEnqueueNDRangeKernel": ("cl_int", "cl_command_queue, cl_kernel, cl_uint, const size_t*, const size_t*, "
                                       "const size_t*, cl_uint, void*, void*"),
  "clGetExtensionFunctionAddress": ("void*", "const char*"),
  "clCreateSubBuffer": ("cl_mem", "cl_mem, cl_ulong, cl_uint, const void*, cl_int*"),
  "clCreateImage": ("cl_mem", "cl_context, cl_ulong, const cl_image_format*, const cl_image_desc*, void*, cl_int*"),
}

# struct _cl_icd_dispatch of Khronos CL/cl_icd.h, in member order up to clCreateImage (the ICD ABI); the members tiny
# calls are typed with their API signature, the others are placeholders of pointer size
ICD_ORDER = (
  "clGetPlatformIDs clGetPlatformInfo clGetDeviceIDs clGetDeviceInfo clCreateContext clCreateContextFromType "
  "clRetainContext clReleaseContext clGetContextInfo clCreateCommandQueue clRetainCommandQueue clReleaseCommandQueue "
  "clGetCommandQueueInfo clSetCommandQueueProperty clCreateBuffer clCreateImage2D clCreateImage3D clRetainMemObject "
  "clReleaseMemObject clGetSupportedImageFormats clGetMemObjectInfo clGetImageInfo clCreateSampler clRetainSampler "
  "clReleaseSampler clGetSamplerInfo clCreateProgramWithSource clCreateProgramWithBinary clRetainProgram "
  "clReleaseProgram clBuildProgram clUnloadCompiler clGetProgramInfo clGetProgramBuildInfo clCreateKernel "
  "clCreateKernelsInProgram clRetainKernel clReleaseKernel clSetKernelArg clGetKernelInfo clGetKernelWorkGroupInfo "
  "clWaitForEvents clGetEventInfo clRetainEvent clReleaseEvent clGetEventProfilingInfo clFlush clFinish "
  "clEnqueueReadBuffer clEnqueueWriteBuffer clEnqueueCopyBuffer clEnqueueReadImage clEnqueueWriteImage "
  "clEnqueueCopyImage clEnqueueCopyImageToBuffer clEnqueueCopyBufferToImage clEnqueueMapBuffer clEnqueueMapImage "
  "clEnqueueUnmapMemObject clEnqueueNDRangeKernel clEnqueueTask clEnqueueNativeKernel clEnqueueMarker "
  "clEnqueueWaitForEvents clEnqueueBarrier clGetExtensionFunctionAddress clCreateFromGLBuffer clCreateFromGLTexture2D "
  "clCreateFromGLTexture3D clCreateFromGLRenderbuffer clGetGLObjectInfo clGetGLTextureInfo clEnqueueAcquireGLObjects "
  "clEnqueueReleaseGLObjects clGetGLContextInfoKHR clGetDeviceIDsFromD3D10KHR clCreateFromD3D10BufferKHR "
  "clCreateFromD3D10Texture2DKHR clCreateFromD3D10Texture3DKHR clEnqueueAcquireD3D10ObjectsKHR "
  "clEnqueueReleaseD3D10ObjectsKHR clSetEventCallback clCreateSubBuffer clSetMemObjectDestructorCallback "
  "clCreateUserEvent clSetUserEventStatus clEnqueueReadBufferRect clEnqueueWriteBufferRect clEnqueueCopyBufferRect "
  "clCreateSubDevicesEXT clRetainDeviceEXT clReleaseDeviceEXT clCreateEventFromGLsyncKHR clCreateSubDevices "
  "clRetainDevice clReleaseDevice clCreateImage").split()

_TYPES = """
typedef int32_t cl_int; typedef uint32_t cl_uint; typedef uint64_t cl_ulong;
typedef struct _cl_platform_id* cl_platform_id; typedef struct _cl_device_id* cl_device_id;
typedef struct _cl_context* cl_context; typedef struct _cl_command_queue* cl_command_queue;
typedef struct _cl_mem* cl_mem; typedef struct _cl_program* cl_program; typedef struct _cl_kernel* cl_kernel;
typedef struct { cl_uint image_channel_order; cl_uint image_channel_data_type; } cl_image_format;
typedef struct { cl_uint image_type; size_t image_width, image_height, image_depth, image_array_size, image_row_pitch,
                 image_slice_pitch; cl_uint num_mip_levels, num_samples; cl_mem buffer; } cl_image_desc;
typedef struct { size_t origin; size_t size; } cl_buffer_region;
typedef cl_int (*icd_get_platforms_t)(cl_uint, cl_platform_id*, cl_uint*);
"""
ffi.cdef(_TYPES + "".join(f"{r} {n}({a});\n" for n, (r, a) in API.items()) +
         "struct icd_dispatch {\n" + "".join(f"  {API[n][0]} (*{n})({API[n][1]});\n" if n in API else f"  void* {n};\n"
                                             for n in ICD_ORDER) + "};\n")

# cl.h constants
CL_SUCCESS, CL_DEVICE_TYPE_ALL = 0, 0xFFFFFFFF
CL_MEM_READ_WRITE, CL_MEM_WRITE_ONLY, CL_MEM_READ_ONLY, CL_MEM_USE_HOST_PTR, CL_MEM_COPY_HOST_PTR = 1, 2, 4, 8, 32
CL_MAP_READ, CL_MAP_WRITE = 1, 2
CL_PLATFORM_NAME = 0x0902
CL_DEVICE_MAX_WORK_GROUP_SIZE, CL_DEVICE_MAX_WORK_ITEM_SIZES, CL_DEVICE_MEM_BASE_ADDR_ALIGN = 0x1004, 0x1005, 0x1019
CL_DEVICE_LOCAL_MEM_SIZE, CL_DEVICE_NAME, CL_DEVICE_EXTENSIONS = 0x1023, 0x102B, 0x1030
CL_PROGRAM_BINARY_SIZES, CL_PROGRAM_BINARIES, CL_PROGRAM_BUILD_LOG = 0x1165, 0x1166, 0x1183
CL_BUFFER_CREATE_TYPE_REGION = 0x1220
CL_RGBA, CL_HALF_FLOAT, CL_FLOAT, CL_MEM_OBJECT_IMAGE2D = 0x10B5, 0x10DD, 0x10DE, 0x10F1
CL_OUT_OF_RESOURCES, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_INVALID_BUFFER_SIZE = -5, -4, -61
ERROR_NAMES = {-1: "CL_DEVICE_NOT_FOUND", -2: "CL_DEVICE_NOT_AVAILABLE", -3: "CL_COMPILER_NOT_AVAILABLE",
               -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE", -5: "CL_OUT_OF_RESOURCES", -6: "CL_OUT_OF_HOST_MEMORY",
               -11: "CL_BUILD_PROGRAM_FAILURE", -30: "CL_INVALID_VALUE", -33: "CL_INVALID_DEVICE",
               -34: "CL_INVALID_CONTEXT", -38: "CL_INVALID_MEM_OBJECT", -46: "CL_INVALID_KERNEL_NAME",
               -48: "CL_INVALID_KERNEL", -49: "CL_INVALID_ARG_INDEX", -50: "CL_INVALID_ARG_VALUE",
               -51: "CL_INVALID_ARG_SIZE", -52: "CL_INVALID_KERNEL_ARGS", -54: "CL_INVALID_WORK_GROUP_SIZE",
               -61: "CL_INVALID_BUFFER_SIZE", -1001: "CL_PLATFORM_NOT_FOUND_KHR"}


class OpenCLUnavailable(OSError):
  """No OpenCL implementation could be loaded; the message says what was tried and how to install one."""


class CLError(RuntimeError):
  """An OpenCL call failed; the message names the call and the error."""


def check(code: int, what: str) -> None:
  """Raise CLError naming `what` when an OpenCL status `code` isn't CL_SUCCESS."""
  if code != CL_SUCCESS: raise CLError(f"{what} failed with OpenCL error {code} ({ERROR_NAMES.get(code, 'unknown')})")


class OpenCL:
  """The API functions of one OpenCL implementation (attributes named as in cl.h) and `platforms()`.

  `how` says where it came from ("loader /path", "icd /path"). For an ICD the functions are looked up in the dispatch
  table of the first platform (all objects of one vendor share it)."""

  def __init__(self, how: str, lib: Any, dispatch: Any = None, platforms: list[Any] | None = None):
    self.how, self._lib, self._dispatch, self._platforms = how, lib, dispatch, platforms

  def __getattr__(self, name: str) -> Any:
    if name not in API: raise AttributeError(f"{name} is not in tiny's OpenCL API subset: {', '.join(API)}")
    fn = getattr(self._dispatch, name) if self._dispatch is not None else getattr(self._lib, name)
    if fn == ffi.NULL: raise CLError(f"the OpenCL implementation ({self.how}) has no {name}")
    setattr(self, name, fn)
    return fn

  def platforms(self) -> list[Any]:
    """The platform ids this implementation offers."""
    if self._platforms is not None: return self._platforms
    n = ffi.new("cl_uint*")
    code = self.clGetPlatformIDs(0, ffi.NULL, n)
    if code == -1001 or n[0] == 0: return []  # CL_PLATFORM_NOT_FOUND_KHR: a loader with no ICD installed
    check(code, "clGetPlatformIDs")
    ids = ffi.new("cl_platform_id[]", n[0])
    check(self.clGetPlatformIDs(n[0], ids, ffi.NULL), "clGetPlatformIDs")
    return list(ids)


# where Android keeps the vendor's OpenCL (Qualcomm's on Adreno phones); ldconfig-less, so find_library misses it
ANDROID_LIBS = ("/vendor/lib64/libOpenCL.so", "/system/vendor/lib64/libOpenCL.so")


def pypi_pocl() -> str | None:
  """The PoCL library of the `pocl-binary-distribution` wheel (it installs `pyopencl/.libs/pocl.icd` naming it), or
  None where that wheel isn't installed."""
  spec = importlib.util.find_spec("pocl_binary_distribution")
  if spec is None or spec.origin is None: return None
  libs = Path(spec.origin).parent.parent / "pyopencl" / ".libs"
  icd = libs / "pocl.icd"
  if not icd.is_file(): return None
  lib = libs / icd.read_text().strip()
  return str(lib) if lib.is_file() else None


# where gcc keeps libgcc (the clang driver's GCC installation search, reduced to the usual Linux layouts)
LIBGCC_GLOBS = ("/usr/lib/gcc/*/*/libgcc.a", "/usr/lib64/gcc/*/*/libgcc.a", "/usr/lib/gcc-cross/*/*/libgcc.a")
# the `ld` PoCL's clang driver runs: ld.lld with the same arguments, less gcc's libraries (absent here)
_LD_WRAPPER = """#!/bin/sh
# written by tiny_runtime_qcom.opencl.pocl_linker: binutils' ld for PoCL's kernel link, without gcc's libgcc
for a do shift; case "$a" in -lgcc|-lgcc_s|-lgcc_eh) ;; *) set -- "$@" "$a";; esac; done
exec {lld} "$@"
"""


def system_linker_ok() -> bool:
  """True when PoCL's own link can work here: an ``ld`` on COMPILER_PATH or PATH and gcc's libgcc on disk."""
  dirs = [d for d in os.environ.get("COMPILER_PATH", "").split(os.pathsep) if d]
  has_ld = any(os.access(os.path.join(d, "ld"), os.X_OK) for d in dirs) or shutil.which("ld") is not None
  return has_ld and any(glob.glob(g) for g in LIBGCC_GLOBS)


def pocl_linker() -> str | None:
  """Make PoCL's kernel link work before PoCL is loaded (see the module docstring): None when the system's ``ld``
  and libgcc are there; else the folder of the ``ld`` wrapper (around ``ld.lld``) now first on ``COMPILER_PATH``.
  Raises `OpenCLUnavailable` when there is no ``ld.lld`` either."""
  if system_linker_ok(): return None
  from tiny_uop.helpers import cache_dir
  from tiny_uop.tools import find_tool
  if (lld := find_tool("ld.lld")) is None:
    raise OpenCLUnavailable("PoCL from PyPI links every kernel with the system linker `ld` and gcc's libgcc, and this "
                            "machine lacks them (no `ld` on PATH or no libgcc under /usr/lib/gcc); install ld.lld from "
                            "PyPI with `pip install ziglang`, or `apt-get install binutils libgcc-12-dev` (or gcc)")
  script = _LD_WRAPPER.format(lld=" ".join(shlex.quote(a) for a in lld))
  d = os.path.join(cache_dir(), "pocl-ld-" + hashlib.sha256(script.encode()).hexdigest()[:16])
  ld = os.path.join(d, "ld")
  if not os.path.isfile(ld):
    os.makedirs(d, exist_ok=True)
    tmp = f"{ld}.{os.getpid()}.tmp"  # written whole, then renamed: a concurrent process sees none or all of it
    with open(tmp, "w") as f: f.write(script)
    os.chmod(tmp, 0o755)
    os.replace(tmp, ld)
  old = os.environ.get("COMPILER_PATH", "")
  if d not in old.split(os.pathsep): os.environ["COMPILER_PATH"] = d + (os.pathsep + old if old else "")
  return d


def load_icd(path: str) -> OpenCL:
  """A vendor ICD library called through its dispatch table (see the module docstring)."""
  try: lib = ffi.dlopen(path)
  except OSError as e: raise OpenCLUnavailable(f"can't load the OpenCL ICD {path}: {e}") from e
  fn = lib.clGetExtensionFunctionAddress(b"clIcdGetPlatformIDsKHR")
  if fn == ffi.NULL: raise OpenCLUnavailable(f"{path} is not an OpenCL ICD: it has no clIcdGetPlatformIDsKHR")
  get = ffi.cast("icd_get_platforms_t", fn)
  n = ffi.new("cl_uint*")
  check(get(0, ffi.NULL, n), f"clIcdGetPlatformIDsKHR of {path}")
  if n[0] == 0: raise OpenCLUnavailable(f"the OpenCL ICD {path} offers no platform")
  ids = ffi.new("cl_platform_id[]", n[0])
  check(get(n[0], ids, ffi.NULL), f"clIcdGetPlatformIDsKHR of {path}")
  dispatch = ffi.cast("struct icd_dispatch**", ids[0])[0]
  return OpenCL(f"icd {path}", lib, dispatch, list(ids))


@functools.cache
def load() -> OpenCL:
  """The OpenCL implementation to use (see the module docstring); OpenCLUnavailable says why there is none."""
  tried: list[str] = []
  if (path := os.environ.get("TINY_OPENCL_ICD")):
    return load_icd(path)
  name = ctypes.util.find_library("OpenCL") or next((p for p in ANDROID_LIBS if os.path.exists(p)), None)
  if name is not None:
    cl = OpenCL(f"loader {name}", ffi.dlopen(name))
    if cl.platforms(): return cl
    tried.append(f"{name} (an ICD loader with no platform installed)")
  else: tried.append("libOpenCL (not found)")
  if (pocl := pypi_pocl()) is not None:
    pocl_linker()  # before PoCL runs a link: on a machine without ld or libgcc it would abort the process
    return load_icd(pocl)
  tried.append("PoCL from PyPI (pocl-binary-distribution not installed)")
  raise OpenCLUnavailable(f"no OpenCL implementation found; tried {', '.join(tried)}. Install one: `pip install "
                          "pocl-binary-distribution` or `apt-get install ocl-icd-libopencl1 pocl-opencl-icd`")


def info_str(cl: OpenCL, fn: str, obj: Any, param: int) -> str:
  """A string-valued clGet*Info parameter."""
  n = ffi.new("size_t*")
  check(getattr(cl, fn)(obj, param, 0, ffi.NULL, n), fn)
  buf = ffi.new("char[]", n[0] + 1)
  check(getattr(cl, fn)(obj, param, n[0], buf, ffi.NULL), fn)
  return ffi.string(buf).decode(errors="replace")


def info_int(cl: OpenCL, fn: str, obj: Any, param: int, ctype: str) -> int:
  """An integer-valued clGet*Info parameter of C type `ctype`."""
  v = ffi.new(f"{ctype}*")
  check(getattr(cl, fn)(obj, param, ffi.sizeof(ctype), v, ffi.NULL), f"{fn}({param:#x})")
  return int(v[0])


class Context:
  """A context and an in-order queue on the first device of an OpenCL platform, with program builds.

  `build(src, name)` builds OpenCL C and returns (program, kernel); a failed build raises `BuildError` carrying the
  compiler's build log. `binary(program)` is the device binary the build produced (clGetProgramInfo)."""

  def __init__(self, cl: OpenCL | None = None, platform: int = 0):
    self.cl = cl = cl if cl is not None else load()
    plats = cl.platforms()
    if not plats: raise OpenCLUnavailable(f"the OpenCL implementation ({cl.how}) offers no platform")
    if not 0 <= platform < len(plats): raise ValueError(f"OpenCL platform {platform}; valid: 0..{len(plats) - 1}")
    self.platform = plats[platform]
    self.platform_name = info_str(cl, "clGetPlatformInfo", self.platform, CL_PLATFORM_NAME)
    dev = ffi.new("cl_device_id*")
    check(cl.clGetDeviceIDs(self.platform, CL_DEVICE_TYPE_ALL, 1, dev, ffi.NULL), "clGetDeviceIDs")
    self.device = dev[0]
    self._devs = ffi.new("cl_device_id[1]", [self.device])
    err = ffi.new("cl_int*")
    self.ctx = cl.clCreateContext(ffi.NULL, 1, self._devs, ffi.NULL, ffi.NULL, err)
    check(err[0], "clCreateContext")
    self.queue = cl.clCreateCommandQueue(self.ctx, self.device, 0, err)
    check(err[0], "clCreateCommandQueue")
    self.name = info_str(cl, "clGetDeviceInfo", self.device, CL_DEVICE_NAME)
    self.extensions = set(info_str(cl, "clGetDeviceInfo", self.device, CL_DEVICE_EXTENSIONS).split())
    self.base_align = max(1, info_int(cl, "clGetDeviceInfo", self.device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, "cl_uint")
                          // 8)

  def build(self, src: str, name: str | None, options: str = "-cl-std=CL2.0 -w") -> tuple[Any, Any]:
    """Build `src`; (program, kernel `name`) -- kernel None when `name` is None. BuildError with the log on failure."""
    cl, err = self.cl, ffi.new("cl_int*")
    srcs = ffi.new("const char*[1]", [s := ffi.new("char[]", src.encode())])
    prg = cl.clCreateProgramWithSource(self.ctx, 1, srcs, ffi.NULL, err)
    check(err[0], "clCreateProgramWithSource")
    del s
    code = cl.clBuildProgram(prg, 1, self._devs, options.encode(), ffi.NULL, ffi.NULL)
    if code != CL_SUCCESS:
      log = info_str_build(cl, prg, self.device)
      cl.clReleaseProgram(prg)
      raise BuildError(f"OpenCL build{f' of {name}' if name else ''} failed with error {code} "
                       f"({ERROR_NAMES.get(code, 'unknown')}) on {self.name}:\n{log}\n--- source ---\n{src}", log)
    if name is None: return prg, None
    k = cl.clCreateKernel(prg, name.encode(), err)
    if err[0] != CL_SUCCESS: cl.clReleaseProgram(prg)
    check(err[0], f"clCreateKernel({name})")
    return prg, k

  def binary(self, prg: Any) -> bytes:
    """The device binary of a built program (one device): CL_PROGRAM_BINARY_SIZES, then CL_PROGRAM_BINARIES."""
    cl = self.cl
    size = ffi.new("size_t[1]")
    check(cl.clGetProgramInfo(prg, CL_PROGRAM_BINARY_SIZES, ffi.sizeof("size_t"), size, ffi.NULL),
          "clGetProgramInfo(CL_PROGRAM_BINARY_SIZES)")
    buf = ffi.new("unsigned char[]", size[0])
    ptrs = ffi.new("unsigned char*[1]", [buf])
    check(cl.clGetProgramInfo(prg, CL_PROGRAM_BINARIES, ffi.sizeof("void*"), ptrs, ffi.NULL),
          "clGetProgramInfo(CL_PROGRAM_BINARIES)")
    return bytes(ffi.buffer(buf, size[0]))

  def finish(self) -> None: check(self.cl.clFinish(self.queue), "clFinish")


def info_str_build(cl: OpenCL, prg: Any, dev: Any) -> str:
  """The build log of `prg` on `dev`."""
  n = ffi.new("size_t*")
  if cl.clGetProgramBuildInfo(prg, dev, CL_PROGRAM_BUILD_LOG, 0, ffi.NULL, n) != CL_SUCCESS: return "(no build log)"
  buf = ffi.new("char[]", n[0] + 1)
  cl.clGetProgramBuildInfo(prg, dev, CL_PROGRAM_BUILD_LOG, n[0], buf, ffi.NULL)
  return ffi.string(buf).decode(errors="replace").strip()


class BuildError(CLError):
  """An OpenCL C build failed; `log` is the compiler's build log (also in the message, with the source)."""

  def __init__(self, msg: str, log: str):
    super().__init__(msg)
    self.log = log
