"""bfloat16 `Tensor.dot` on the CPU: where the probe confirms AMX tiles, a 2-D product whose M, N and K 32 divides
runs `tiny_codegen.x86_amx`'s tile kernel in one launch (B packed in k-pairs inside it, float32 sums, one rounding
to bfloat16); any other
shape, or the probe off (`TINY_CPU_PROBE=0`), keeps the float32 kernel. Either way the numbers are torch's bfloat16
matmul's (it also sums in float32) to one bfloat16 rounding."""
import numpy as np
import pytest
import torch
from tiny_tensor import Tensor
from tiny_uop import Ops, dtypes

from tiny_codegen import x86_amx

pytestmark = pytest.mark.dev_session("CPU")  # the tile kernel is the LLVM CPU renderer's

rng = np.random.default_rng(39)


def _sources(t: Tensor) -> list[str]:
  """The source text of every kernel `t`'s schedule runs (compiled through `get_program`, as realize does)."""
  from tiny_codegen import get_program
  from tiny_uop.plugins import Device
  return [get_program(c.src[0], Device["CPU"].renderer).src for c in t.schedule().calls if c.src[0].op is Ops.SINK]


def _check(shape_a: tuple, shape_b: tuple) -> list[str]:
  a, b = rng.standard_normal(shape_a).astype(np.float32), rng.standard_normal(shape_b).astype(np.float32)
  out = Tensor(a).cast(dtypes.bfloat16).realize() @ Tensor(b).cast(dtypes.bfloat16).realize()
  srcs = _sources(out)
  want = (torch.from_numpy(a).bfloat16() @ torch.from_numpy(b).bfloat16()).float().numpy()
  assert out.dtype == dtypes.bfloat16
  np.testing.assert_allclose(out.float().numpy(), want, rtol=0, atol=2 ** -8 * float(np.abs(want).max()))
  return srcs


def _amx() -> bool: return x86_amx.request_tile_state()


@pytest.mark.parametrize("m, k, n", [(64, 96, 32), (96, 160, 64), (32, 1056, 96), (320, 2048, 32)])
def test_tile_kernel_where_amx_runs(m: int, k: int, n: int) -> None:
  """One kernel: the tiles with B's pack and the bf16 rounding in (odd block counts: 3 and 5 row blocks, K of 33
  steps, 2048 k in two K blocks on a 48 KB L1d)."""
  if not _amx(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  srcs = _check((m, k), (k, n))
  assert len(srcs) == 1 and "tdpbf16ps" in srcs[0], [s[:80] for s in srcs]


@pytest.mark.parametrize("shape_a, shape_b", [((64, 33), (33, 32)),     # odd K
                                              ((64, 48), (48, 32)),     # K not a multiple of the tile's 32
                                              ((30, 64), (64, 64)),     # an M tail
                                              ((64, 64), (64, 40)),     # an N tail
                                              ((2, 64, 64), (64, 32))])  # batched: the float32 kernel
def test_other_shapes_keep_the_float32_kernel(shape_a: tuple, shape_b: tuple) -> None:
  assert not any("tdpbf16ps" in s for s in _check(shape_a, shape_b))


def test_probe_off_keeps_the_float32_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  assert not any("tdpbf16ps" in s for s in _check((64, 128), (128, 96)))


def test_no_tile_permission_keeps_the_float32_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  """A CPU whose kernel refuses `arch_prctl(ARCH_REQ_XCOMP_PERM)` (the probe's child ran the tiles, this process may
  not): the float32 kernel, numbers as torch's."""
  monkeypatch.setattr(x86_amx, "_arch_prctl_tiles", lambda: False)
  assert not any("tdpbf16ps" in s for s in _check((96, 224), (224, 64)))


def test_flags_without_amx_keep_the_float32_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  """Flags as a Zen 4's cpuinfo lists them (AVX512-BF16, no AMX): `cpu_probe.executes` answers False without a
  child, and `dot` keeps the float32 kernel."""
  from tiny_codegen import cpu_probe
  flags = frozenset({"avx512_bf16", "f16c"})
  real = cpu_probe.executes
  monkeypatch.setattr(cpu_probe, "executes", lambda feature, flags_=None: real(feature, flags=flags))
  assert not any("tdpbf16ps" in s for s in _check((160, 64), (64, 128)))


@pytest.mark.parametrize("m, k, n", [(64, 2048, 2048), (32, 1024, 2048), (32, 2080, 2048)])
def test_amx_rows_padded_apart(m: int, k: int, n: int) -> None:
  """Where a k step's 32 A rows would share too few L1d sets (`x86_amx.a_row_pad` of this host's model: rows of 4 KB
  or 2 KB on a 48 KB 12-way or 32 KB 8-way L1d), `dot` copies A's rows a cache line apart first (a second kernel)
  and the tile kernel reads them at that stride; rows of 4160 bytes (K=2080) are read in place. torch's numbers."""
  if not _amx(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  from tiny_codegen.machine import host_machine
  mach = host_machine()
  pad = x86_amx.a_row_pad(n, k, mach.l1d_set_span, mach.l1d_ways)
  srcs = _check((m, k), (k, n))
  assert len(srcs) == (2 if pad else 1) and "tdpbf16ps" in srcs[-1], [s[:80] for s in srcs]
  assert f"i64 {(k + pad) * 2})" in srcs[-1]  # the A tiles' row stride in bytes


def test_a_row_pad_copy_moves_bits() -> None:
  """The copy `dot` pads A's rows with (`pad(...).contiguous()`, `x86_amx.a_row_pad`) moves bfloat16 bits as they
  are, like numpy's pad of the same uint16 bits: NaN payloads, -0.0, denormals and infinities kept, zeros in the pad,
  and (LLVM) no float32 round trip in the kernel (`lower.decomp.bf16_to_float`)."""
  bits = rng.integers(0, 1 << 16, (64, 96), dtype=np.uint16)
  bits[0, :6] = [0x7FA1, 0xFFC3, 0x8000, 0x0001, 0x7F80, 0xFF80]  # NaNs with payloads, -0.0, a denormal, +-inf
  x = Tensor(bits).bitcast(dtypes.bfloat16).pad(((0, 0), (0, 32))).contiguous()
  srcs = _sources(x)
  got = x.bitcast(dtypes.uint16).numpy()
  np.testing.assert_array_equal(got, np.pad(bits, ((0, 0), (0, 32))))
  if srcs[-1].startswith("declare") or "define void" in srcs[-1]:  # the LLVM renderer's IR
    assert "fcmp" not in srcs[-1] and "float" not in srcs[-1], srcs[-1]
