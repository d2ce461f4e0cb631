"""bfloat16 `Tensor.dot` on a CPU whose probe confirms AVX512-BF16 and whose AMX tiles don't run (Zen 4): any 2-D
shape runs `tiny_codegen.x86_bf16`'s `vdpbf16ps` kernel in one launch (B packed in k-pairs inside it, float32 sums,
one rounding to bfloat16), odd M, N and K included; the probe off (`TINY_CPU_PROBE=0`) keeps the float32 kernel. Either
way torch's bfloat16 matmul's numbers (it also sums in float32) to one bfloat16 rounding, and the same bits for
infinities and NaN. Where the CPU lacks the instruction the kernel isn't chosen (checked everywhere); the IR and
`program`'s choice on a described machine are tiny-codegen's tests/test_x86_bf16.py."""
import numpy as np
import pytest
import torch
from tiny_tensor import Tensor
from tiny_uop import Ops, dtypes

from tiny_codegen import x86_amx, x86_bf16
from tiny_codegen.machine import host_machine

pytestmark = pytest.mark.dev_session("CPU")  # the kernel is the LLVM CPU renderer's

rng = np.random.default_rng(39)


def _sources(t: Tensor) -> list[str]:
  """The source text of every kernel `t`'s schedule runs (compiled through `get_program`, as realize does)."""
  from tiny_codegen import get_program
  from tiny_uop.plugins import Device
  return [get_program(c.src[0], Device["CPU"].renderer).src for c in t.schedule().calls if c.src[0].op is Ops.SINK]


def _runs_here() -> bool: return not x86_amx.request_tile_state() and x86_bf16.usable(host_machine())


def _check(a: np.ndarray, b: np.ndarray) -> tuple[list[str], np.ndarray]:
  out = Tensor(a).cast(dtypes.bfloat16).realize() @ Tensor(b).cast(dtypes.bfloat16).realize()
  srcs = _sources(out)
  want = (torch.from_numpy(a).bfloat16() @ torch.from_numpy(b).bfloat16()).float().numpy()
  assert out.dtype == dtypes.bfloat16
  got = out.float().numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -8 * float(np.abs(want).max()))
  return srcs, out.bitcast(dtypes.uint16).numpy()


@pytest.mark.parametrize("m, k, n", [(64, 96, 32), (7, 33, 40), (30, 5, 17), (2, 64, 64), (64, 3, 96),
                                     (100, 257, 300), (13, 1024, 129), (256, 512, 1024)])
def test_one_vdpbf16ps_kernel_where_it_runs(m: int, k: int, n: int) -> None:
  """One kernel with the instruction, at any size: M remainders, ragged column strips, odd K (a size of 1 is a vector
  product, no range to match: lowered as usual)."""
  if not _runs_here(): pytest.skip("this CPU runs AMX tiles or no vdpbf16ps (test_probe_off ran the fallback)")
  srcs, _ = _check(rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32))
  assert len(srcs) == 1 and "avx512bf16.dpbf16ps" in srcs[0], [s[:80] for s in srcs]


def test_probe_off_keeps_the_float32_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  srcs, _ = _check(rng.standard_normal((50, 70)).astype(np.float32), rng.standard_normal((70, 90)).astype(np.float32))
  assert not any("dpbf16ps" in s for s in srcs)


def test_not_chosen_where_the_probe_fails(monkeypatch: pytest.MonkeyPatch) -> None:
  """Flags that list AVX512-BF16 but a probe child that died (SIGILL): the float32 kernel, torch's numbers."""
  from tiny_codegen import cpu_probe
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: -4)
  srcs, _ = _check(rng.standard_normal((48, 64)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32))
  assert not any("dpbf16ps" in s for s in srcs)


def test_infinities_and_nan_round_as_the_float32_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  """Rows with an infinity or a NaN give the same bfloat16 bits as the float32 kernel's cast (inf stays inf, inf -
  inf and NaN read 0x7FC0), the finite rows torch's numbers in both."""
  a, b = rng.standard_normal((20, 37)).astype(np.float32), rng.standard_normal((37, 50)).astype(np.float32)
  a[0, 3], a[1, 5], a[2, 0] = np.inf, np.nan, -np.inf
  b[:, 7] = np.abs(b[:, 7])  # column 7: all positive, so row 0 gives +inf there, row 2 -inf
  a_fin = a.copy()
  a_fin[:3] = 0
  _check(a_fin, b)
  out = (Tensor(a).cast(dtypes.bfloat16).realize() @ Tensor(b).cast(dtypes.bfloat16).realize()).bitcast(dtypes.uint16)
  srcs, got = _sources(out), out.numpy()
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  base = (Tensor(a).cast(dtypes.bfloat16).realize() @ Tensor(b).cast(dtypes.bfloat16).realize()).bitcast(dtypes.uint16)
  assert not any("dpbf16ps" in s for s in _sources(base))
  want = base.numpy()
  np.testing.assert_array_equal(got[:3], want[:3])
  assert got[0, 7] == 0x7F80 and got[2, 7] == 0xFF80 and got[1, 7] == 0x7FC0
  if _runs_here(): assert any("dpbf16ps" in s for s in srcs)


@pytest.mark.parametrize("epilogue", ["bias", "relu"])
def test_epilogue_runs_after_the_kernel(epilogue: str) -> None:
  """A bias or an activation on the product: the `vdpbf16ps` kernel, then the epilogue in a kernel of its own (fused,
  the AST would no longer be the product the kernel matches, and the sum would be lowered unpacked); torch's numbers."""
  if not _runs_here(): pytest.skip("this CPU runs AMX tiles or no vdpbf16ps (test_probe_off ran the fallback)")
  a, b = rng.standard_normal((40, 72)).astype(np.float32), rng.standard_normal((72, 96)).astype(np.float32)
  c = rng.standard_normal(96).astype(np.float32)
  ta, tb, tc = (Tensor(x).cast(dtypes.bfloat16).realize() for x in (a, b, c))
  qa, qb, qc = (torch.from_numpy(x).bfloat16() for x in (a, b, c))
  out, want = (ta.linear(tb, tc), qa @ qb + qc) if epilogue == "bias" else ((ta @ tb).relu(), (qa @ qb).relu())
  srcs = _sources(out)
  assert len(srcs) == 2 and "avx512bf16.dpbf16ps" in srcs[0] and "dpbf16ps" not in srcs[1], [s[:80] for s in srcs]
  want_f = want.float().numpy()
  np.testing.assert_allclose(out.float().numpy(), want_f, rtol=0, atol=2 ** -7 * float(np.abs(want_f).max()))


@pytest.mark.parametrize("m, k, n", [(64, 96, 32), (7, 33, 40), (1, 16, 24), (24, 16, 1), (1, 5, 1)])
def test_whole_kernel_graph_is_the_tensor_ops_graph(m: int, k: int, n: int) -> None:
  """`dot`'s directly built graph for the whole-product kernel (`_bf16_whole`) is the very UOp `Tensor`'s ops make
  (widened operands broadcast, multiplied, summed over K in float32, rounded to bfloat16, contiguous), so the
  kernels' recogniser sees what it saw before; built on any CPU (it is only a graph)."""
  from tiny_tensor.tensor import _bf16_whole
  ta, tb = (Tensor(rng.standard_normal(s).astype(np.float32)).cast(dtypes.bfloat16) for s in ((m, k), (k, n)))
  ops = ((ta.reshape(m, 1, k).float() * tb.reshape(1, k, n).transpose(-1, -2).float()).sum(-1)
         .cast(dtypes.bfloat16).contiguous())
  got = _bf16_whole(ta, tb, dtypes.float32)
  assert got.uop is ops.uop and got.shape == (m, n) and got.dtype == dtypes.bfloat16
  assert got.uop.device == ta.device  # (set on the node, not walked: the walk's answer)
  tr, wr = (Tensor(rng.standard_normal(s).astype(np.float32)).cast(dtypes.bfloat16).realize() for s in ((m, k), (k, n)))
  ops_r = ((tr.reshape(m, 1, k).float() * wr.reshape(1, k, n).transpose(-1, -2).float()).sum(-1)
           .cast(dtypes.bfloat16).contiguous())
  got_r = _bf16_whole(tr, wr, dtypes.float32)
  assert got_r.uop is ops_r.uop and got_r.uop.device == "CPU"


def test_kernel_choice_kept_per_shape_and_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
  """`dot` asks which kernel takes a bfloat16 product (`_bf16_kernel`: the AMX check, `x86_bf16.for_renderer`) once
  per shape and renderer: a second product of the shape asks neither and gives torch's numbers again; a shape not
  a multiple of the register block (7 x 33 x 40) likewise; a new renderer thread count, the probe switched off, or a
  probe function replaced asks afresh (the answer follows: the float32 kernel where the probe is off)."""
  import tiny_tensor.tensor as tt
  from tiny_uop.plugins import Device
  asked: list[tuple[int, int, int]] = []
  real_for, real_amx = x86_bf16.for_renderer, tt._amx_tiles
  monkeypatch.setattr(x86_bf16, "for_renderer", lambda r, m, n, k: asked.append((m, n, k)) or real_for(r, m, n, k))
  monkeypatch.setattr(tt, "_amx_tiles", lambda x, w: asked.append((-1, -1, -1)) or real_amx(x, w))
  tt._BF16_KERNELS.clear()
  a, b = rng.standard_normal((7, 33)).astype(np.float32), rng.standard_normal((33, 40)).astype(np.float32)
  first, _ = _check(a, b)
  n_first = len(asked)
  assert n_first >= 1  # the first product of the shape asked
  again, _ = _check(a, b)
  assert len(asked) == n_first and again == first  # kept: same kernels, torch's numbers
  _check(rng.standard_normal((9, 33)).astype(np.float32), b)
  assert len(asked) > n_first  # another shape asks
  n2 = len(asked)
  r = Device["CPU"].renderer
  monkeypatch.setattr(r, "threads", getattr(r, "threads", 1) + 1)
  assert tt._bf16_kernel(Tensor(a).cast(dtypes.bfloat16), Tensor(b).cast(dtypes.bfloat16)) in ("amx", "avx512_bf16",
                                                                                                None)
  assert len(asked) > n2  # another thread count asks
  monkeypatch.undo()  # (the renderer's threads and the wrappers back)
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  assert tt._bf16_kernel(Tensor(a).cast(dtypes.bfloat16), Tensor(b).cast(dtypes.bfloat16)) is None
  # (a shape not compiled before: a program compiled while the probe was on stays in the program cache)
  srcs, _ = _check(rng.standard_normal((11, 35)).astype(np.float32), rng.standard_normal((35, 42)).astype(np.float32))
  assert not any("dpbf16ps" in s for s in srcs)
  monkeypatch.delenv("TINY_CPU_PROBE")
  from tiny_codegen import cpu_probe
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: -4)  # the child died of SIGILL: a new function, asked again
  assert tt._bf16_kernel(Tensor(a).cast(dtypes.bfloat16), Tensor(b).cast(dtypes.bfloat16)) is None
  monkeypatch.undo()
  if _runs_here(): assert tt._bf16_kernel(Tensor(a).cast(dtypes.bfloat16), Tensor(b).cast(dtypes.bfloat16)) == \
    "avx512_bf16" and any("dpbf16ps" in s for s in first)
