"""Images (`IMAGE=1`, Adreno-style): a kernel's read-only float32 buffers read through the texture path.

`image_params(sink, max_width)`: every float32 buffer PARAM that the kernel only LOADs from (never STOREs to, never
uses otherwise) and whose size is a multiple of 4 becomes an image PARAM `dtypes.imagef((h, w, 4))`: the buffer's
floats in order, 4 per RGBA texel, `w` texels a row (`w` the largest divisor of the texel count <= `max_width`; a
buffer with no such layout, h also <= `max_width`, stays a buffer). A load of element `i` reads texel `i // 4` at
int2 `(t % w, t // w)` -- one `read_imagef` that the loads of the texel's other elements share -- and picks channel
`i % 4` (a constant after simplification when the access is float4-aligned, as in an upcast contiguous axis).
Gates stay: a gated load reads 0.

The layout is the buffer's bytes, so the runtime makes each image param from the buffer it is launched with (a copy,
or an image view of the buffer where the device has `cl_khr_image2d_from_buffer`); kernel outputs stay buffers. This
decision is per kernel: no contract between kernels or with the scheduler changes.

`pm_images` applies it to a whole kernel (a rule on its SINK): the OpenCL renderer runs it as its `extra_matcher` when
images are on (`IMAGE>=1` or an `OpenCLRenderer("image")`).
"""
from __future__ import annotations

from tiny_uop.dtype import ImageDType, PtrDType, dtypes
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.uop import Ops, UOp

IMAGE_MAX_WIDTH = 8192  # texels a row (and rows) of an image2d_t: the OpenCL spec's minimum (Adreno has 16384)


def image_shape(size: int, max_width: int = IMAGE_MAX_WIDTH, width_multiple: int = 1) -> tuple[int, int, int] | None:
  """(h, w, 4) for a buffer of `size` floats: `w` the largest divisor of size/4 <= max_width that is a multiple of
  `width_multiple` (a device whose image rows must be aligned: Adreno's 64-byte pitch is 4 float texels); None when
  size isn't a multiple of 4 or no width fits (or the height would exceed max_width too)."""
  if size <= 0 or size % 4: return None
  texels = size // 4
  w = next((d for d in range(min(texels, max_width), 0, -1) if texels % d == 0 and d % width_multiple == 0), 0)
  return (texels // w, w, 4) if w and texels // w <= max_width else None


def _read_only(sink: UOp) -> dict[UOp, list[UOp]]:
  """float32 buffer PARAMs used only as LOAD(INDEX(param, ...)) -> those INDEXes."""
  users: dict[UOp, list[UOp]] = {}
  bad: set[UOp] = set()
  topo = sink.toposort()
  loaded = {u.src[0] for u in topo if u.op is Ops.LOAD}
  for u in topo:
    for s in u.src:
      if s.op is not Ops.PARAM or not isinstance(s.dtype, PtrDType) or isinstance(s.dtype, ImageDType): continue
      if u.op is Ops.INDEX and u.src[0] is s and u in loaded and s.dtype.base == dtypes.float32:
        users.setdefault(s, []).append(u)
      else: bad.add(s)
  stored = {u.src[0].src[0] for u in topo if u.op is Ops.STORE and u.src[0].op is Ops.INDEX}
  return {p: idxs for p, idxs in users.items() if p not in bad and p not in stored}


def image_params(sink: UOp, max_width: int = IMAGE_MAX_WIDTH, width_multiple: int = 1) -> UOp:
  """`sink` with its read-only float32 buffers read as images (see the module docstring); image widths are
  multiples of `width_multiple` (`image_shape`)."""
  subs: dict[UOp, UOp] = {}
  for p, idxs in _read_only(sink).items():
    assert isinstance(p.dtype, PtrDType)
    if (shape := image_shape(p.dtype.size, max_width, width_multiple)) is None: continue
    w = shape[1]
    img = UOp(Ops.PARAM, dtypes.imagef(shape), arg=p.arg)
    for idx in idxs:
      i = idx.src[1] if idx.src[1].dtype == dtypes.int32 else idx.src[1].cast(dtypes.int32)
      t = i // 4
      coord = UOp(Ops.VECTORIZE, dtypes.int32.vec(2), (t % w, t // w))
      subs[idx] = img.index(coord, *idx.src[2:]) if len(idx.src) > 2 else img.index(coord)
  if not subs: return sink
  # the loads of an image INDEX read a float4 texel and pick the element's channel
  chan: dict[UOp, UOp] = {}
  for u in sink.toposort():
    if u.op is Ops.LOAD and u.src[0] in subs:
      texel = UOp(Ops.LOAD, dtypes.float32.vec(4), (subs[u.src[0]], *u.src[1:]))
      c = (u.src[0].src[1] if u.src[0].src[1].dtype == dtypes.int32 else u.src[0].src[1].cast(dtypes.int32)) % 4
      ch = [UOp(Ops.GEP, dtypes.float32, (texel,), (k,)) for k in range(4)]
      val = ch[3]
      for k in (2, 1, 0): val = c.eq(k).where(ch[k], val)
      chan[u] = val
  return sink.substitute(chan, name="image_params")


def _images_rule(s: UOp) -> UOp | None:
  out = image_params(s)
  return out if out is not s else None


pm_images = PatternMatcher([(UPat(Ops.SINK, name="s"), _images_rule)], name="images")


def _images_pitch64_rule(s: UOp) -> UOp | None:
  out = image_params(s, width_multiple=4)
  return out if out is not s else None


# images whose rows are a multiple of 4 RGBA float texels (64 bytes: the Adreno a6xx texture pitch alignment)
pm_images_pitch64 = PatternMatcher([(UPat(Ops.SINK, name="s"), _images_pitch64_rule)], name="images_pitch64")
