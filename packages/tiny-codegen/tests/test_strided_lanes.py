"""Vector lanes that walk their input with a constant stride (issue #39; docs/PIPELINE.md §4, "Lanes"): a stride-2
conv or pool's input row. On a renderer whose expander vectorizes (LLVM on the CPU) such a load is one load of the
s*(n-1)+1 elements from lane 0's to lane n-1's and a shuffle (a GEP of several lanes) keeping every s-th, where it
was gathered lane by lane; a gate that depends on the lane (padding) masks the kept elements and masks the others
off. Checked against numpy with CHECK_OOB on buffers that end exactly at the last lane's element (the wide load
must not run past it); the C renderer (no vector lanes of its own) refuses the shuffle."""
from __future__ import annotations

import re

import numpy as np
import pytest
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device

from tiny_codegen import get_program
from tiny_codegen.opt import Opt, OptOps
from tiny_codegen.renderer.cstyle import ClangRenderer


def strided_ast(n_out: int, s: int, off: int, pad: int, lanes: int, name: str, spare: int = 0) -> tuple[UOp, int]:
  """(out[i] = 2 * in[s*i + off - pad], 0 where that index is outside in (`pad` > 0: a padded row's border), the
  input's size): `in` holds exactly up to the element the last output reads, and `spare` elements past it."""
  size = s * (n_out - 1) + off - pad + 1 + spare
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(n_out), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(size), arg=1)
  i = UOp.range(n_out, 0)
  idx = i * s + (off - pad)
  ld = x.index(idx, (idx >= 0) & (idx < size)) if pad else x.index(idx)
  opts = (Opt(OptOps.UPCAST, 0, lanes),)
  return out.index(i).store(ld.load() * 2.0).sink(arg=KernelInfo(name, opts_to_apply=opts)), size


def want(xs: np.ndarray, n_out: int, s: int, off: int, pad: int) -> np.ndarray:
  idx = np.arange(n_out) * s + off - pad
  ok = (idx >= 0) & (idx < xs.size)
  return np.where(ok, xs[np.clip(idx, 0, xs.size - 1)] * 2, 0).astype(np.float32)


def run_llvm(ast: UOp, size: int, n_out: int) -> tuple[np.ndarray, np.ndarray, str]:
  """(output, input, source) of `ast` compiled and run on the CPU device with CHECK_OOB."""
  from tiny_uop.device import Buffer
  xs = np.random.default_rng(size).standard_normal(size).astype(np.float32)
  dev = Device["CPU"]
  with Context(CHECK_OOB=1):
    spec = get_program(ast, dev.renderer)
    prg = dev.get_program(spec.name, spec.lib)
    bufs = [Buffer("CPU", n, dtypes.float32).ensure_allocated() for n in (n_out, size)]
    bufs[1].copyin(memoryview(xs.tobytes()))
    prg(*[b._buf for b in bufs], global_size=spec.global_size, local_size=spec.local_size)
  res = bytearray(n_out * 4)
  bufs[0].copyout(memoryview(res))
  return np.frombuffer(res, np.float32), xs, spec.src


def _llvm() -> None:
  if type(Device["CPU"].renderer).__name__ != "LLVMRenderer": pytest.skip("vector lanes are the LLVM renderer's")


def _wide(s: int, lanes: int) -> tuple[int, int]:
  """(the elements from lane 0's to the last lane's, the load's width: the next power of two)."""
  w = s * (lanes - 1) + 1
  return w, 1 << (w - 1).bit_length()


@pytest.mark.parametrize("s,lanes,off", [(2, 8, 0), (2, 14, 1), (3, 4, 2), (4, 8, 3), (2, 16, 0)])
def test_strided_lanes_are_one_wide_load_and_a_shuffle(s: int, lanes: int, off: int) -> None:
  # the buffer ends at the last lane's element: the load's elements past it are masked off (a constant mask)
  _llvm()
  n_out = 3 * lanes
  ast, size = strided_ast(n_out, s, off, 0, lanes, f"strided_{s}_{lanes}_{off}")
  got, xs, src = run_llvm(ast, size, n_out)
  np.testing.assert_array_equal(got, want(xs, n_out, s, off, 0))
  w, wide = _wide(s, lanes)
  keep = ", ".join(f"i32 {k}" for k in range(0, w, s))
  assert f"shufflevector <{wide} x float> " in src and f"<{lanes} x i32> <{keep}>" in src, src
  assert f"@llvm.masked.load.v{wide}f32" in src and not re.findall(r"= load ", src), src  # nothing gathered
  mask = dict((int(m.group(2)), m.group(1))
              for m in re.finditer(rf"insertelement <{wide} x i1> \S+, i1 (true|false), i32 (\d+)", src))
  assert mask == {k: "true" if k < w else "false" for k in range(wide)}, mask


@pytest.mark.parametrize("s,lanes", [(2, 8), (3, 4)])
def test_strided_lanes_in_bounds_are_a_plain_load(s: int, lanes: int) -> None:
  # with room past the last lane's element for the whole wide load (the index's bounds say so), no mask
  _llvm()
  n_out = 2 * lanes
  w, wide = _wide(s, lanes)
  ast, size = strided_ast(n_out, s, 1, 0, lanes, f"strided_room_{s}_{lanes}", spare=wide - w)
  got, xs, src = run_llvm(ast, size, n_out)
  np.testing.assert_array_equal(got, want(xs, n_out, s, 1, 0))
  assert len(re.findall(rf"= load <{wide} x float>", src)) == 1 and "masked.load" not in src, src


@pytest.mark.parametrize("s,lanes,off,pad", [(2, 8, 0, 1), (2, 14, 2, 3), (3, 4, 0, 2), (2, 4, 1, 2)])
def test_padded_strided_lanes_are_one_masked_load(s: int, lanes: int, off: int, pad: int) -> None:
  # lane 0 of the first vector reads before the buffer: masked off, never read (CHECK_OOB would say so)
  _llvm()
  n_out = 2 * lanes
  ast, size = strided_ast(n_out, s, off, pad, lanes, f"strided_pad_{s}_{lanes}_{off}_{pad}")
  got, xs, src = run_llvm(ast, size, n_out)
  np.testing.assert_array_equal(got, want(xs, n_out, s, off, pad))
  w, wide = _wide(s, lanes)
  assert f"@llvm.masked.load.v{wide}f32" in src and f"shufflevector <{wide} x float>" in src, src
  # only the kept lanes' elements are read: a constant false in the mask everywhere else
  mask = [(int(m.group(2)), m.group(1))
          for m in re.finditer(rf"insertelement <{wide} x i1> \S+, i1 (\S+), i32 (\d+)", src)]
  between = [v for k, v in mask if k % s or k >= w]
  assert len(between) == wide - lanes and all(v == "false" for v in between), mask


class _VectorClang(ClangRenderer):
  """The C renderer handed the LLVM renderer's vector lanes (which it never gets: it doesn't vectorize)."""
  vectorize_upcast = True


def test_c_refuses_a_shuffle_rather_than_render_one_lane() -> None:
  # a GEP of several lanes rendered as `v[lane0]` would be a wrong number with no error
  ast, _ = strided_ast(8, 2, 1, 0, 4, "strided_c_refused")
  r = _VectorClang()
  r.threads = 1
  with pytest.raises(NotImplementedError, match=r"C renderer has no shuffle of lanes \(0, 2, 4, 6\)"):
    get_program(ast, r)


def test_a_row_gate_is_kept_on_an_in_bounds_strided_load() -> None:
  # out[r, i] = in[r, 2*i] where r % 2 == 0, else 0: the gate doesn't depend on the lane, and the wide load lies in
  # the buffer by the index's bounds; the gate still decides (the odd rows read nothing and give 0)
  _llvm()
  R, n_out, s, lanes = 4, 16, 2, 8
  row = s * n_out + 8  # room past each row's last lane for the wide load
  out, x = UOp(Ops.PARAM, dtypes.float.ptr(R * n_out), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(R * row), arg=1)
  r, i = UOp.range(R, 0), UOp.range(n_out, 1)
  ld = x.index(r * row + i * s, (r % 2).eq(0)).load()
  ast = out.index(r * n_out + i).store(ld).sink(arg=KernelInfo("strided_row_gate", opts_to_apply=(
    Opt(OptOps.UPCAST, 1, lanes),)))
  from tiny_uop.device import Buffer
  xs = np.random.default_rng(3).standard_normal(R * row).astype(np.float32)
  dev = Device["CPU"]
  with Context(CHECK_OOB=1):
    spec = get_program(ast, dev.renderer)
    prg = dev.get_program(spec.name, spec.lib)
    bufs = [Buffer("CPU", n, dtypes.float32).ensure_allocated() for n in (R * n_out, R * row)]
    bufs[1].copyin(memoryview(xs.tobytes()))
    prg(*[b._buf for b in bufs], global_size=spec.global_size, local_size=spec.local_size)
  res = bytearray(R * n_out * 4)
  bufs[0].copyout(memoryview(res))
  got = np.frombuffer(res, np.float32).reshape(R, n_out)
  want = xs.reshape(R, row)[:, :s * n_out:s] * (np.arange(R) % 2 == 0)[:, None]
  np.testing.assert_array_equal(got, want)
  assert "shufflevector <16 x float>" in spec.src, spec.src
