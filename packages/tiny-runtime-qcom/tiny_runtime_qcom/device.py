"""The QCOM device: `QCOM` (KGSL on an Adreno 6xx phone) and `MOCK+QCOM` (the same driver code against `mock/`); and
the `CL` device (OpenCL, `tiny_runtime_qcom.cl`).

`QCOMDevice(HCQCompiled)` opens `/dev/kgsl-3d0` through a `FileIOInterface` (`KGSLIface`), creates a compute draw
context, keeps signals, command buffers and kernel arguments in GPU objects that are mapped on the CPU at their GPU
address, compiles kernels with the device's own OpenCL compiler (`AdrenoCompiler`: OpenCL C -> Qualcomm's program
binary), loads the binary's shader image itself (`QCOMProgram`) and dispatches it with a6xx command streams
(`a6xx.QCOMComputeQueue`), submitted with GPU_COMMAND. Signals are memory written by the GPU (CACHE_FLUSH_TS); a
host wait first sleeps in KGSL on the submission's timestamp. There is no copy engine: copies go through the CPU
mapping (`HCQAllocator`). TinyJit replays through HCQ2 (`QCOMGraph`: tiny_uop.hcq2's passes with QCOM's encoder,
`encode.pm_lower`): one command buffer in GPU memory, run with CP_INDIRECT_BUFFER.

Without an Adreno GPU, `QCOMDevice("QCOM")` raises RuntimeError("no Adreno GPU (/dev/kgsl-3d0 not found)"), which
the registry reports; `DEV=MOCK+QCOM` always works where an OpenCL CPU platform (PoCL) is installed.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence, cast

from tiny_uop.hcq import ArgsLayout, FileIOInterface, HCQAllocator, HCQBuffer, HCQCompiled, HCQProgram, \
  HCQSignal
from tiny_uop.hcq2 import HCQ2Graph
from tiny_uop.helpers import del_errors
from tiny_uop.target import Target

from tiny_runtime_qcom import a6xx, adreno
from tiny_runtime_qcom import cl as _cl
from tiny_runtime_qcom.a6xx import QCOMComputeQueue
from tiny_runtime_qcom.encode import pm_lower
from tiny_runtime_qcom.kgsl import KGSL_PATH, KGSLIface
from tiny_runtime_qcom.opencl import OpenCLUnavailable

__all__ = ["QCOMDevice", "QCOMProgram", "QCOMSignal", "CLDevice", "KGSL_PATH"]

SIGNAL_PAGE, CMD_RING, KERNARGS_SIZE = 0x1000, 4 << 20, 2 << 20
ALWAYS_ON_MHZ = 19.2  # CP_ALWAYS_ON_COUNTER ticks per microsecond (the 19.2 MHz XO clock of Snapdragon SoCs)
MAX_THREADS = 1024     # work-items per work-group on a6xx


def _round_up(x: int, a: int) -> int: return (x + a - 1) // a * a
def _next_pow2(x: int) -> int: return 1 if x <= 1 else 1 << (x - 1).bit_length()


class QCOMSignal(HCQSignal):
  """A signal in GPU memory whose host wait sleeps in KGSL first: DEVICE_WAITTIMESTAMP_CTXTID on the context's last
  submission (which wrote every signal submitted before it), then reads the value."""

  def __init__(self, addr: int, dev: QCOMDevice, value: int = 0):
    super().__init__(addr, value, timestamp_divider=ALWAYS_ON_MHZ)
    self.dev = dev

  def wait(self, value: int, timeout_ms: int = 30000) -> None:
    if self.value >= value: return
    if (ts := self.dev.kgsl.last_timestamp): self.dev.kgsl.wait_timestamp(ts, timeout_ms)
    super().wait(value, timeout_ms)


class QCOMProgram(HCQProgram):
  """A kernel binary from the device's OpenCL compiler, its shader image loaded into GPU memory by this runtime.

  Argument region (`layout`): the const file (`const_units` vec4s: immediates from the binary, buffer addresses
  (64-bit) and int32 values at the offsets the binary's argument records give), then a 16-dword texture descriptor
  per read-only image argument, one per write-only image (UAV), and a 4-dword sampler per sampler the kernel uses.
  Image arguments are described in place: an RGBA float32 2D image of the (h, w) texels the source declares, at the
  buffer's address, `w * 16` bytes a row (a multiple of 64: `QCOMRenderer` lays images out so)."""

  def __init__(self, dev: QCOMDevice, name: str, lib: bytes, **kwargs: Any):
    super().__init__(dev, name, lib)
    self.dev: QCOMDevice = dev
    self.info, blob = adreno.unpack_lib(lib)
    if self.info.name != name: raise ValueError(f"QCOM program for kernel {self.info.name!r} loaded as {name!r}")
    b = self.binary = adreno.AdrenoBinary.parse(blob, name)
    if len(b.args) != len(self.info.args):
      raise ValueError(f"kernel {name}: the source has {len(self.info.args)} arguments, the binary {len(b.args)}")
    want = {"buf": adreno.ARG_CONST, "val": adreno.ARG_CONST, "tex": adreno.ARG_TEX, "uav": adreno.ARG_UAV}
    for i, ((kind, _, w), arg) in enumerate(zip(self.info.args, b.args)):
      if want[kind] != arg.kind: raise ValueError(f"kernel {name}: argument {i} is a {kind} in the source but of kind "
                                                  f"{arg.kind} in the binary")
      if kind in ("tex", "uav") and (w * 16) % a6xx.PITCH_ALIGN:
        raise ValueError(f"kernel {name}: image argument {i} is {w} texels wide, a {w * 16}-byte pitch; a6xx needs a "
                         f"multiple of {a6xx.PITCH_ALIGN} (render with QCOMRenderer)")
    self.buf_args = [i for i, a in enumerate(self.info.args) if a[0] != "val"]  # call order: buffers, then values
    self.val_args = [i for i, a in enumerate(self.info.args) if a[0] == "val"]
    self.tex_index = {i: n for n, i in enumerate(i for i, a in enumerate(self.info.args) if a[0] == "tex")}
    self.uav_index = {i: n for n, i in enumerate(i for i, a in enumerate(self.info.args) if a[0] == "uav")}
    need = max([64] + [a.const_off + (4 if k[0] == "val" else 8) for a, k in zip(b.args, self.info.args)
                       if k[0] in ("buf", "val")] + [off + sz for _, off, sz in b.consts])
    const_bytes = _round_up(need, 64)
    if const_bytes // 16 > 1020: raise ValueError(f"kernel {name} needs {const_bytes} bytes of constants; max 16320")
    self.layout = Layout(const_bytes, len(self.tex_index), len(self.uav_index), b.samplers)
    # the shader image, read by CP_LOAD_STATE6 in 128-byte units
    self.instr_units = (len(b.image) + 127) // 128
    self.lib_buf = dev._gpu_alloc(self.instr_units * 128)
    ctypes.memmove(self.lib_buf.va_addr, b.image, len(b.image))
    self.shader_addr, self.pc_offset = self.lib_buf.va_addr, b.pc_offset
    self.fregs, self.hregs, self.branchstack = b.fregs, b.hregs, b.branchstack
    self.shared_units = max(1, (b.shmem - 1) // 1024)  # SP_CS_CNTL_1.SHARED_SIZE, as the Qualcomm driver sets it
    # private memory, sized as the Qualcomm driver sizes it (traces): 512-byte units per work-item, 128 x 2 waves
    self.pvtmem_per_item = _round_up(b.pvtmem, 512) >> 9
    self.pvtmem_total = self.pvtmem_per_item * 128 * 2
    self.stack_offset = _round_up(_next_pow2(_round_up(b.pvtmem, 512)) * 128 * 16, 0x1000)
    dev.ensure_stack(self.stack_offset * 4)
    # work-items per group the register file allows: 384 x 32 full registers per SP (a6xx), in waves of 128
    self.max_threads = min(MAX_THREADS, (384 * 32 // (max(1, self.fregs + _round_up(self.hregs, 2) // 2) * 128)) * 128)

  def args_layout(self, n_bufs: int, n_vals: int) -> ArgsLayout:
    if (n_bufs, n_vals) != (len(self.buf_args), len(self.val_args)):
      raise ValueError(f"kernel {self.name} takes {len(self.buf_args)} buffers and {len(self.val_args)} values, "
                       f"got {n_bufs} and {n_vals}")
    lay, args = self.layout, self.binary.args
    bufs = tuple(lay.tex_off + 64 * self.tex_index[i] + 16 if i in self.tex_index else
                 lay.uav_off + 64 * self.uav_index[i] + 16 if i in self.uav_index else args[i].const_off
                 for i in self.buf_args)
    return ArgsLayout(lay.size, 0, bufs, tuple(args[i].const_off for i in self.val_args))

  def fill_args(self, base: int, bufs: Sequence[int], vals: Sequence[int]) -> int:
    """The whole argument region: immediates, buffer addresses, values, image descriptors, samplers."""
    lay = self.layout
    ctypes.memset(base, 0, lay.size)
    for value, off, size in self.binary.consts:
      ctypes.memmove(base + off, value.to_bytes(size, "little"), size)
    for i, addr in zip(self.buf_args, bufs):
      kind, h, w = self.info.args[i]
      if kind == "buf": ctypes.c_uint64.from_address(base + self.binary.args[i].const_off).value = addr
      else:
        off = lay.tex_off + 64 * self.tex_index[i] if kind == "tex" else lay.uav_off + 64 * self.uav_index[i]
        desc = a6xx.tex_const(a6xx.TexDesc(a6xx.FMT6_32_32_32_32_FLOAT, w, h, w * 16, addr), storage=kind == "uav")
        # typeshed: a c_uint32 array slice takes ints
        (ctypes.c_uint32 * a6xx.TEX_CONST_DWORDS).from_address(base + off)[:] = desc  # type: ignore[assignment]
    for i, v in zip(self.val_args, vals): ctypes.c_int32.from_address(base + self.binary.args[i].const_off).value = v
    samp = a6xx.tex_samp_nearest_unnorm_border()
    # typeshed: a c_uint32 array slice takes ints
    for n in range(lay.n_samp):
      (ctypes.c_uint32 * 4).from_address(base + lay.samp_off + 16 * n)[:] = samp  # type: ignore[assignment]
    return base

  def _image_bases(self, bufs: Sequence[Any]) -> tuple[list[int], list[HCQBuffer]]:
    """Buffer addresses for the launch; a read-only image whose buffer isn't 32-byte aligned (a view) is read from
    an aligned copy, freed once the launch is done."""
    addrs, staged = [], []
    for i, b in zip(self.buf_args, bufs):
      kind, h, w = self.info.args[i]
      if kind == "tex" and b.va_addr % a6xx.BASE_ALIGN:
        self.dev.synchronize()
        tmp = self.dev._gpu_alloc(h * w * 16)
        ctypes.memmove(tmp.va_addr, b.va_addr, min(h * w * 16, b.size))
        staged.append(tmp)
        addrs.append(tmp.va_addr)
      elif kind == "uav" and b.va_addr % a6xx.BASE_ALIGN:
        raise ValueError(f"kernel {self.name}: write-only image argument {i} at {b.va_addr:#x} is not "
                         f"{a6xx.BASE_ALIGN}-byte aligned")
      else: addrs.append(b.va_addr)
    return addrs, staged

  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    gs, ls = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size or (1, 1, 1)) + (1, 1, 1))[:3]
    if ls[0] * ls[1] * ls[2] > self.max_threads:
      raise RuntimeError(f"kernel {self.name}: a work-group of {ls} is {ls[0] * ls[1] * ls[2]} work-items; its "
                         f"registers allow {self.max_threads}")
    dev = self.dev
    base = dev.kernargs_alloc(self.layout.size)
    addrs, staged = self._image_bases(bufs)
    self.fill_args(base, addrs, vals)
    q = dev.hw_compute_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1).memory_barrier()
    if wait: q.timestamp(dev.time_signals[0])
    q.exec(self, base, gs, ls)
    if wait: q.timestamp(dev.time_signals[1])
    q.signal(dev.timeline_signal, after := dev.next_timeline()).submit(dev)
    for tmp in staged: dev.defer_free(tmp, after)
    if not wait: return None
    dev.synchronize()
    return (dev.time_signals[1].timestamp - dev.time_signals[0].timestamp) / 1e6

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    if getattr(self, "lib_buf", None) is None: return  # refused before its code buffer was allocated
    with _errors("QCOMProgram.__del__ (freeing its code buffer)"):
      self.dev.defer_free(self.lib_buf, self.dev.timeline_value - 1)


def graphable(dev: Any, call: Any) -> bool:
  """May this captured call join a QCOM graph: a kernel of a `QCOMProgram` (copies run outside: QCOM copies through
  the CPU mapping) none of whose read-only images is a kept buffer view not 32-byte aligned (the texture base
  alignment, TEX_CONST_4.BASE_LO): such a kernel runs outside the graph, where its launch stages the image
  (`QCOMProgram._image_bases`)."""
  prg = getattr(call, "prg", None)
  if not isinstance(prg, QCOMProgram): return False
  return not any(not isinstance(b, int) and prg.info.args[i][0] == "tex" and b.va_addr % a6xx.BASE_ALIGN
                 for i, b in zip(prg.buf_args, call.bufs))


class QCOMGraph(HCQ2Graph):
  """TinyJit's graph on QCOM: `HCQ2Graph` with QCOM's encoder (`encode.pm_lower`), taking the kernels `graphable`
  accepts. A texture or UAV descriptor's base address is an argument patch like a buffer pointer
  (`QCOMProgram.args_layout` points at its BASE_LO/BASE_HI dwords).

  A replay input read as a texture must be 32-byte aligned (the texture base, TEX_CONST_4.BASE_LO), as the eager
  launch makes it (`QCOMProgram._image_bases`): an unaligned one (a view) is copied, once the device is idle, into a
  staging buffer the graph keeps, and the replay reads that. An input that is also a plain buffer argument (which a
  kernel may write) or a write-only image can't be staged: an unaligned one is a ValueError naming it."""
  supports = staticmethod(graphable)

  def __init__(self, dev: Any, calls: Sequence[Any]):
    super().__init__(dev, calls)
    self._tex_inputs: dict[int, int] = {}  # input slot -> bytes the textures read
    self._other_inputs: dict[int, str] = {}  # input slot -> how else a kernel uses it
    for c in self.calls:
      prg = c.prg
      for i, b in zip(prg.buf_args, c.bufs):
        if not isinstance(b, int): continue
        kind, h, w = prg.info.args[i]
        if kind == "tex": self._tex_inputs[b] = max(self._tex_inputs.get(b, 0), h * w * 16)
        else:
          what = "a write-only image" if kind == "uav" else "a buffer"
          self._other_inputs.setdefault(b, f"{what} of {getattr(c, 'name', prg.name)}")
    self._staged: dict[int, HCQBuffer] = {}

  def __call__(self, inputs: Sequence[Any], var_vals: dict[str, int] | None = None) -> None:
    self.replay(self._image_inputs(inputs) if self._tex_inputs else inputs, var_vals or {})

  def _image_inputs(self, inputs: Sequence[Any]) -> Sequence[Any]:
    for slot, how in self._other_inputs.items():
      if how.startswith("a write-only") and inputs[slot].va_addr % a6xx.BASE_ALIGN:
        raise ValueError(f"replay input {slot} at {inputs[slot].va_addr:#x} is {how}, which must be "
                         f"{a6xx.BASE_ALIGN}-byte aligned")
    bad = [slot for slot in self._tex_inputs if inputs[slot].va_addr % a6xx.BASE_ALIGN]
    if not bad: return inputs
    out = list(inputs)
    self.dev.synchronize()  # the input is written and the last replay (which read the staging buffers) is done
    for slot in bad:
      if slot in self._other_inputs:
        raise ValueError(f"replay input {slot} at {inputs[slot].va_addr:#x} is read as a texture, which needs a "
                         f"{a6xx.BASE_ALIGN}-byte aligned base, and is also {self._other_inputs[slot]}: pass an "
                         "aligned buffer (a contiguous copy)")
      n = self._tex_inputs[slot]
      if (tmp := self._staged.get(slot)) is None: tmp = self._staged[slot] = self.dev._gpu_alloc(n)
      ctypes.memmove(tmp.va_addr, inputs[slot].va_addr, min(n, inputs[slot].size))
      out[slot] = tmp
    return out

  def __del__(self, _errors: type[del_errors] = del_errors) -> None:
    with _errors("QCOMGraph.__del__ (freeing its staged textures)"):
      for tmp in getattr(self, "_staged", {}).values(): self.dev.defer_free(tmp, self.last_signal)
    super().__del__()


class Layout:
  """Byte offsets in a QCOM argument region (see `QCOMProgram`)."""

  def __init__(self, const_bytes: int, n_tex: int, n_uav: int, n_samp: int):
    self.const_bytes, self.n_tex, self.n_uav, self.n_samp = const_bytes, n_tex, n_uav, n_samp
    self.const_units = const_bytes // 16
    self.tex_off = const_bytes
    self.uav_off = self.tex_off + 64 * n_tex
    self.samp_off = self.uav_off + 64 * n_uav
    self.size = self.samp_off + 16 * n_samp


class QCOMDevice(HCQCompiled):
  """``QCOM`` (KGSL, Adreno 6xx) and ``MOCK+QCOM`` (mock KGSL + an a630 that runs kernels on PoCL)."""
  hw_compute_queue_t = QCOMComputeQueue
  hw_copy_queue_t = None  # no copy engine: HCQAllocator copies through the CPU mapping
  pm_lower = pm_lower  # HCQ2's encoder (encode.py)
  hcq2_copy_engine = "compute"  # HCQ2: one engine for everything

  def __init__(self, device: str):
    target = Target.parse(device).check_interface()
    fio: type[FileIOInterface] = FileIOInterface
    self._driver: Any = None
    if target.interface == "MOCK":
      from tiny_runtime_qcom.mock.driver import MockFileIO, driver
      fio, self._driver = MockFileIO, driver()
    self.kgsl = KGSLIface(fio)
    self.signal_page = self.kgsl.alloc(SIGNAL_PAGE, uncached=True)
    base = self.signal_page.va_addr
    self._free_signals = list(range(base, base + SIGNAL_PAGE, HCQSignal.SIZE))[::-1]
    # the CACHE_FLUSH_TS timestamp of cache write-backs: one signal slot nobody waits on, in this device's queue class
    flush = {"flush_addr": self._free_signals.pop()}
    self.hw_compute_queue_t = cast(type[QCOMComputeQueue], type("QCOMComputeQueue", (QCOMComputeQueue,), flush))
    self.cmd_ring, self._cmd_ptr = self.kgsl.alloc(CMD_RING), 0
    self.kernargs, self._kernargs_ptr = self.kgsl.alloc(KERNARGS_SIZE), 0
    self.border = self.kgsl.alloc(0x1000)  # the border color table: zeros (CLK_ADDRESS_CLAMP reads 0 outside)
    self.border_addr = self.border.va_addr
    self.stack: HCQBuffer | None = None
    self.stack_addr = 0
    self._old_stacks: list[HCQBuffer] = []
    if self._driver is not None:
      from tiny_runtime_qcom.mock.compiler import MockAdrenoCompiler
      self.compiler: Any = MockAdrenoCompiler(self._driver)
    else:
      from tiny_runtime_qcom.compiler import AdrenoCompiler
      try: self.compiler = AdrenoCompiler(self.kgsl.info.arch)
      except OpenCLUnavailable as e:
        raise RuntimeError(f"{KGSL_PATH} is here but no OpenCL to compile kernels with: {e}") from e
    from tiny_codegen.renderer.opencl import QCOMHalfStorageRenderer, QCOMRenderer
    ren = QCOMRenderer if "cl_khr_fp16" in self.compiler.extensions else QCOMHalfStorageRenderer
    super().__init__(device, HCQAllocator(self), [ren], QCOMProgram, QCOMGraph, arch=self.kgsl.info.arch)
    self.time_signals = [self.new_signal(), self.new_signal()]

  def hcq_submitter(self, engine: str) -> Any:
    """HCQ2's submit: the parts' dwords (a bound command buffer `(address, ndwords)` as a CP_INDIRECT_BUFFER to it)
    copied into the command ring and submitted with one GPU_COMMAND."""
    if engine != "compute": raise ValueError(f"{self.device} has only a compute engine, not {engine!r}")

    def submit(parts: list) -> None:
      if len(parts) == 1 and isinstance(parts[0], list): return self.submit_dwords(parts[0])
      dwords: list[int] = []
      for p in parts:  # a queue made here holds no HCQVar (those are HCQ2's): its dwords are ints
        q = p if isinstance(p, list) else self.hw_compute_queue_t().indirect_buffer(*p)._q
        dwords += q  # type: ignore[arg-type]
      self.submit_dwords(dwords)
    return submit

  def select_renderer(self, name: str | None) -> Any:
    """The renderer, compiling with this device's compiler and sized by its limits."""
    r = super().select_renderer(name)
    r.compiler = self.compiler
    lim = self.compiler.limits
    r.max_workgroup_size, r.shared_max = lim["max_workgroup_size"], lim["shared_max"]
    r.local_max = (lim["max_workgroup_size"],) * 3
    return r

  def new_signal(self, value: int = 0) -> HCQSignal:
    if not self._free_signals:
      raise RuntimeError(f"{self.device}: all {SIGNAL_PAGE // HCQSignal.SIZE} signals are in use")
    return QCOMSignal(self._free_signals.pop(), self, value)

  def _gpu_alloc(self, size: int, host: bool = False) -> HCQBuffer: return self.kgsl.alloc(size)
  def _gpu_free(self, buf: HCQBuffer) -> None: self.kgsl.free(buf)

  def ensure_stack(self, size: int) -> None:
    """The private-memory stack buffer holds at least `size` bytes (a replaced one stays: graphs may point at it)."""
    if not size or (self.stack is not None and self.stack.size >= size): return
    if self.stack is not None: self._old_stacks.append(self.stack)
    self.stack = self.kgsl.alloc(size)
    self.stack_addr = self.stack.va_addr

  def submit_dwords(self, dwords: list[int]) -> None:
    """Copy a queue's dwords into the command ring and submit them (the ring wraps once the GPU retired it all)."""
    n = 4 * len(dwords)
    if n > CMD_RING: raise ValueError(f"a submission of {len(dwords)} dwords does not fit the {CMD_RING}-byte ring")
    if self._cmd_ptr + n > CMD_RING:
      if self.kgsl.last_timestamp: self.kgsl.wait_timestamp(self.kgsl.last_timestamp)
      self._cmd_ptr = 0
    addr = self.cmd_ring.va_addr + self._cmd_ptr
    # typeshed: a c_uint32 array slice takes ints
    (ctypes.c_uint32 * len(dwords)).from_address(addr)[:] = dwords  # type: ignore[assignment]
    self._cmd_ptr = _round_up(self._cmd_ptr + n, 64)
    self.submit_ib(addr, len(dwords))

  def submit_ib(self, addr: int, ndwords: int) -> None: self.kgsl.submit(addr, ndwords)


class CLDevice(_cl.CLDevice):
  """``CL`` (OpenCL through cffi; PoCL runs it on a CPU): see `tiny_runtime_qcom.cl`. Opening it without an OpenCL
  implementation raises RuntimeError with what was tried; ``MOCK+CL`` has no mock (MOCK+QCOM runs kernels on CL)."""

  def __init__(self, device: str = "CL"):
    if Target.parse(device).check_interface((None,)).interface is not None: raise AssertionError
    try: super().__init__(device)
    except OpenCLUnavailable as e: raise RuntimeError(str(e)) from e
    except _cl.CLError as e: raise RuntimeError(f"{device}: OpenCL is installed but unusable: {e}") from e
