"""`Tensor.dot` on an AVX2 or AVX-512 CPU realizes a large (or transposed) right operand as contiguous column panels
first (`gemm_panel`): the results, gradients and kernels of those matmuls, with the CPU renderer's register file set
to AVX2's or AVX-512's whatever this host has."""

import numpy as np
import pytest
import torch
from tiny_tensor import Tensor
from tiny_uop import Ops, dtypes

# CPU-pinned: the packing is the CPU renderer's; other sessions read B in place
# (the conftest deselects it in the other sessions)
pytestmark = pytest.mark.dev_session("CPU")


def kernels(t: Tensor) -> list[str]:
  return [c.src[0].arg.name for c in t.schedule().calls if c.src[0].op is Ops.SINK]


rng = np.random.default_rng(23)


@pytest.mark.parametrize("regs, k, transposed, want", [
  ((16, 32), 512, False, ["E_32_512_16", "r_128_512"]),  # AVX2, B of 1 MB: copied into 32 panels of 16 columns
  ((32, 64), 512, False, ["r_128_512"]),                 # AVX-512 reads 1 MB in place (its 8-row block keeps up)
  ((32, 64), 2048, False, ["E_16_2048_32", "r_128_512"]),  # ... and packs 4 MB into 16 panels of 32 columns
  ((32, 64), 512, True, ["E_16_512_32", "r_128_512"]),   # a transposed 1 MB B is packed on AVX-512 too
])
def test_matmul_packs_b_by_register_file(vector_registers, regs: tuple, k: int, transposed: bool, want: list) -> None:
  vector_registers(*regs)
  a, b = rng.standard_normal((128, k)).astype(np.float32), rng.standard_normal((k, 512)).astype(np.float32)
  bt = np.ascontiguousarray(b.T)
  out = Tensor(a) @ (Tensor(bt).T if transposed else Tensor(b))
  names = kernels(out)
  assert names == want, names
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=2e-4)


def test_transposed_narrow_b_is_packed_from_two_panels(vector_registers) -> None:
  # x @ w.T with w (64 x 1024), nn.Linear's layout, 512 rows: in place each vector of B's columns is a gather,
  # packed it is two contiguous panels; one panel's width (32 columns on AVX-512) stays in place
  vector_registers(32, 64)
  x = rng.standard_normal((512, 1024)).astype(np.float32)
  for n, copies in ((64, ["E_2_1024_32"]), (32, [])):
    w = rng.standard_normal((n, 1024)).astype(np.float32)
    out = Tensor(x) @ Tensor(w).T
    names = kernels(out)
    assert [c for c in names if c.startswith("E_")] == copies and len(names) > len(copies), (n, names)
    np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=2e-4)
  # with 256 rows the same 256 KB B is read in place (the copy and its launch cost more than the gathers)
  w = rng.standard_normal((64, 1024)).astype(np.float32)
  assert not [c for c in kernels(Tensor(x[:256]) @ Tensor(w).T) if c.startswith("E_")]


def test_small_and_narrow_matmuls_read_b_in_place(vector_registers) -> None:
  vector_registers(16, 32)
  for m, k, n in ((63, 512, 512), (64, 256, 256), (64, 1024, 1000)):  # few rows; B within L2; no whole panels
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = Tensor(a) @ Tensor(b)
    assert len(kernels(out)) == 1, (m, k, n)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_packed_matmul_batched_transposed_and_fused(vector_registers) -> None:
  # a batched left operand (its rows: 2 x 40), B a transposed view (nn.Linear's weight.T), relu fused after
  vector_registers(16, 32)
  x, w = rng.standard_normal((2, 40, 256)).astype(np.float32), rng.standard_normal((1024, 256)).astype(np.float32)
  out = (Tensor(x) @ Tensor(w).T).relu()
  assert len(kernels(out)) == 2
  np.testing.assert_allclose(out.numpy(), np.maximum(x @ w.T, 0), rtol=1e-4, atol=1e-4)


def test_packed_half_matmul_sums_in_float(vector_registers) -> None:
  vector_registers(16, 32)
  a, b = rng.standard_normal((128, 512)).astype(np.float16), rng.standard_normal((512, 512)).astype(np.float16)
  out = Tensor(a) @ Tensor(b)
  assert out.dtype == dtypes.half and len(kernels(out)) == 2
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
  np.testing.assert_allclose(out.numpy().astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-2)


def test_packed_matmul_gradients_match_torch(vector_registers) -> None:
  vector_registers(16, 32)
  a, b = rng.standard_normal((64, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
  g = rng.standard_normal((64, 512)).astype(np.float32)
  ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
  ((ta @ tb) * Tensor(g)).sum().backward()
  pa, pb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  ((pa @ pb) * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(ta.grad.numpy(), pa.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(tb.grad.numpy(), pb.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_packed_tiled_bfloat16_matmul_matches_torch(vector_registers, monkeypatch) -> None:
  """bfloat16 x bfloat16 on AVX-512 without bf16 instructions (the fallback: products and sums in float32, rounded
  to bfloat16 once): B (1024 x 512, 2 MB as float32 panels) is packed and the rows tiled (B past the model's 1 MB L2);
  torch's bfloat16 matmul also accumulates in float32, so the two agree to a bfloat16 rounding. TINY_CPU_PROBE=0
  pins the fallback on a CPU with AMX tiles (test_bf16_amx.py covers those)."""
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  vector_registers(32, 64)
  a, b = rng.standard_normal((128, 1024)).astype(np.float32), rng.standard_normal((1024, 512)).astype(np.float32)
  ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
  out = Tensor(a).cast(dtypes.bfloat16).realize() @ Tensor(b).cast(dtypes.bfloat16).realize()
  from tiny_codegen.opt.search import heuristic_opts
  from tiny_uop.plugins import Device
  opts = [heuristic_opts(c.src[0], Device["CPU"].renderer) for c in out.schedule().calls if c.src[0].op is Ops.SINK]
  assert out.dtype == dtypes.bfloat16 and len(opts) == 2, opts  # the pack, then the matmul
  assert any(o.op.name == "TILE" for o in opts[1]), opts
  want = (ta @ tb).float().numpy()
  got = out.float().numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -7 * float(np.abs(want).max()))


@pytest.mark.parametrize("regs, rows, packed", [
  ((32, 64), 32, True),   # AVX-512: 4 blocks of 8 rows gather B four times in place; packed once
  ((32, 64), 16, False),  # 2 blocks: the copy costs about what it saves
  ((16, 32), 16, True),   # AVX2: 4 blocks of 4 rows
  ((16, 32), 8, False),
])
def test_prefill_linear_packs_b_by_register_blocks(vector_registers, regs: tuple, rows: int, packed: bool) -> None:
  # a prefill chunk through nn.Linear's layout (x @ w.T, w 2048 x 768: 6 MB, past the L2): packed from
  # `pack_min_rows_strided` rows, and the product is numpy's either way
  vector_registers(*regs)
  x = rng.standard_normal((rows, 768)).astype(np.float32)
  w = rng.standard_normal((2048, 768)).astype(np.float32)
  out = Tensor(x) @ Tensor(w).T
  names = kernels(out)
  assert bool([c for c in names if c.startswith("E_")]) == packed, names
  np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=5e-4)


@pytest.mark.parametrize("regs, rows, packed", [((32, 64), 64, True), ((32, 64), 16, False), ((16, 32), 16, True)])
def test_attention_scores_copy_the_transposed_keys(vector_registers, regs: tuple, rows: int, packed: bool) -> None:
  # q @ k.T per head (2 heads of 64), k a permuted view of a fused qkv projection (K its contiguous axis), scaled as
  # GPT-2 does: from `pack_min_rows_strided` query rows the keys are copied contiguous first (the scale with them);
  # numbers and gradients as torch's either way
  vector_registers(*regs)
  a = rng.standard_normal((rows, 3 * 128)).astype(np.float32)
  g = rng.standard_normal((2, rows, rows)).astype(np.float32)

  def scores(qkv, mod):
    q = qkv[:, :128].reshape(rows, 2, 64).permute(1, 0, 2)
    k = qkv[:, 128:256].reshape(rows, 2, 64).permute(1, 2, 0)
    return q @ (k * 0.125)
  tq, pq = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  out, want = scores(tq, Tensor), scores(pq, torch)
  names = kernels(out)
  assert len(names) == (2 if packed else 1) and names[0].startswith("E_") == packed, names
  np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-4, atol=2e-4)
  (out * Tensor(g)).sum().backward()
  (want * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(tq.grad.numpy(), pq.grad.numpy(), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("transposed", [False, True])
def test_batched_b_is_packed_per_matrix(vector_registers, transposed: bool) -> None:
  # a batched right operand of 1 MB a matrix (AVX2 packs from the model's 1 MB L2) is packed into panels per matrix,
  # as a 2-D one is: in place each matrix's column strip thrashed the L2 (0.46x numpy at (4, 1024, 1024)^2 on the
  # Xeon 6/207). Odd sizes: 70 rows (no 4-row block divides them), K = 520, N = 528 (33 AVX2 panels of 16 columns),
  # A's batch (3, 1) broadcast against B's (2,); B transposed (nn.Linear's layout, batched) is gathered by the same
  # one copy (no contiguous copy before it). Numbers and gradients as torch's.
  vector_registers(16, 32)
  x = rng.standard_normal((3, 1, 70, 520)).astype(np.float32)
  w = rng.standard_normal((2, 528, 520) if transposed else (2, 520, 528)).astype(np.float32)
  g = rng.standard_normal((3, 2, 70, 528)).astype(np.float32)
  tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  out = tx @ (tw.transpose(-1, -2) if transposed else tw)
  want = px @ (pw.transpose(-1, -2) if transposed else pw)
  names = kernels(out)
  assert names == ["E_2_33_520_16", "r_3_2_70_528"], names  # the panel copy, then the matmul
  np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-4, atol=5e-4)
  (out * Tensor(g)).sum().backward()
  (want * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(tw.grad.numpy(), pw.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("a_transposed", [False, True])
def test_packed_tiled_matmul_of_odd_sizes(vector_registers, a_transposed: bool) -> None:
  # the whole AVX-512 path on sizes no block divides: 1001 rows (7 x 11 x 13: no 8-row block), K = 1003, N = 1056
  # (33 panels of 32 columns, an odd count); B 4.2 MB, past the model's 1 MB L2, so packed and the rows tiled;
  # A also as a transposed view (its broadcasts read down a column). numpy's product in float64 as the reference.
  vector_registers(32, 64)
  a = rng.standard_normal((1003, 1001) if a_transposed else (1001, 1003)).astype(np.float32)
  b = rng.standard_normal((1003, 1056)).astype(np.float32)
  ta = Tensor(a).T if a_transposed else Tensor(a)
  out = ta @ Tensor(b)
  from tiny_codegen.opt.search import heuristic_opts
  from tiny_uop.plugins import Device
  calls = [c.src[0] for c in out.schedule().calls if c.src[0].op is Ops.SINK]
  assert [c.arg.name for c in calls] == ["E_33_1003_32", "r_1001_1056"], calls  # the panel copy, then the matmul
  opts = heuristic_opts(calls[1], Device["CPU"].renderer)
  assert any(o.op.name == "TILE" for o in opts), opts
  want = (a.T if a_transposed else a).astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)


def test_packed_product_builds_its_graph_directly(vector_registers, monkeypatch) -> None:
  # a 2-D float32 product that is packed builds its nodes at the UOp level (`_packed_product`): one Tensor for the
  # result, where the general branch's movement ops made ~14 (each reshape's checks and wrapper: ~0.3 ms of CPU a
  # call on the Xeon 6/207, ~5% of a two-thread 1024^2 kernel). Same kernels, and numpy's numbers, with an explicit
  # dtype=float32, a transposed A and a transposed B (packed from gathers) on sizes no block divides.
  vector_registers(32, 64)
  made = []
  new = Tensor._new
  monkeypatch.setattr(Tensor, "_new", staticmethod(lambda *a, **kw: made.append(1) or new(*a, **kw)))
  a, b = rng.standard_normal((1001, 1003)).astype(np.float32), rng.standard_normal((1003, 1056)).astype(np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  made.clear()
  out = ta @ tb
  assert len(made) == 1, len(made)
  assert [c.src[0].arg.name for c in out.schedule().calls if c.src[0].op is Ops.SINK] == ["E_33_1003_32", "r_1001_1056"]
  want = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(ta.dot(tb, dtype=dtypes.float32).numpy(), want, rtol=1e-4, atol=1e-3)
  at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
  np.testing.assert_allclose((Tensor(at).T @ Tensor(bt).T).numpy(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", ["half", "mixed", "dtype", "batched"])
def test_every_packed_2d_b_takes_the_one_graph(vector_registers, monkeypatch, case: str) -> None:
  # half operands (float32 products), mixed half @ float32, half with dtype=float32 and a 3-D A on a 2-D B all
  # build `_packed_product`'s graph (1-2 Tensors; the Tensor-level copy of that graph made ~14 each), with numpy's
  # float64 numbers on sizes no register block or panel divides
  vector_registers(32, 64)
  made = []
  new = Tensor._new
  monkeypatch.setattr(Tensor, "_new", staticmethod(lambda *a, **kw: made.append(1) or new(*a, **kw)))
  a = rng.standard_normal((3, 201, 1003) if case == "batched" else (603, 1003)).astype(np.float32)
  b = rng.standard_normal((1003, 1056)).astype(np.float32)
  da, db, dt = {"half": (np.float16, np.float16, None), "mixed": (np.float16, np.float32, None),
                "dtype": (np.float16, np.float16, dtypes.float32), "batched": (np.float32, np.float32, None)}[case]
  a, b = a.astype(da), b.astype(db)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  made.clear()
  out = ta.dot(tb, dtype=dt)
  assert len(made) <= (3 if case == "batched" else 1), len(made)  # (batched: A flattened, the product reshaped)
  names = kernels(out)
  assert len(names) == 2 and names[0].startswith("E_33_1003_32"), names  # B's 33 panels, then the product
  want = a.astype(np.float64) @ b.astype(np.float64)
  tol = 1e-4 if out.dtype == dtypes.float32 else 2e-3
  assert out.shape == want.shape and out.dtype == (dtypes.half if case == "half" else dtypes.float32)
  np.testing.assert_allclose(out.numpy().astype(np.float64), want, rtol=tol, atol=tol * np.sqrt(1003) * 4)


@pytest.mark.parametrize("layout", ["plain", "b_transposed", "a_batched"])
def test_packed_bfloat16_odd_sizes_match_float64(vector_registers, layout: str) -> None:
  # bfloat16 on sizes 32 doesn't divide (no AMX tiles: the packed float32 path, B's panels converted by the copy):
  # within one bfloat16 rounding of numpy's float64 product of the same bfloat16 values, for a plain B, nn.Linear's
  # transposed view and a batched A
  vector_registers(32, 64)
  k, n = 1003, 1056
  a32 = rng.standard_normal((2, 301, k) if layout == "a_batched" else (603, k)).astype(np.float32)
  b32 = rng.standard_normal((k, n)).astype(np.float32)
  ta = Tensor(a32).cast(dtypes.bfloat16).realize()
  tb = (Tensor(np.ascontiguousarray(b32.T)).cast(dtypes.bfloat16).realize().T if layout == "b_transposed"
        else Tensor(b32).cast(dtypes.bfloat16).realize())
  out = ta @ tb
  names = kernels(out)
  assert out.dtype == dtypes.bfloat16 and len(names) == 2 and names[0].startswith("E_33_1003_32"), names
  want = ta.float().numpy().astype(np.float64) @ tb.float().numpy().astype(np.float64)
  got = out.float().numpy().astype(np.float64)
  # float32 sums of exact products (k x 2^-24 relative to the absolute sum), then one rounding to bfloat16 (2^-8)
  absum = np.abs(ta.float().numpy().astype(np.float64)) @ np.abs(tb.float().numpy().astype(np.float64))
  assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want) + k * 2.0 ** -24 * absum), \
    float(np.max(np.abs(got - want) - 2.0 ** -8 * np.abs(want)))
