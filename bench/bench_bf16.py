"""bfloat16 matmul on an x86-64 CPU: tiny's `Tensor` path beside torch's, and the kernels a bf16 path could use.

1. GFLOPS of `a @ b` (N x N, bfloat16 in, float32 sums) in turns (`settle.time_in_turns`, best call of 3 rounds x 5):
   `tiny` (`Tensor` bf16 matmul: the AMX tile kernel where it runs, else the float32 kernel on widened inputs),
   `torch` (oneDNN: AMX where it runs), and `tiny_amx`: `tiny_codegen.x86_amx`'s tile kernel called directly on the
   CPU runtime (B's pack in the kernel; float32 out), only where `x86_amx.request_tile_state()` says the tiles run;
   `tiny_dp`: `tiny_codegen.x86_bf16`'s `vdpbf16ps` kernel called likewise (the machine model's register block), only
   where `x86_bf16.usable` (the probe ran AVX512-BF16). Target (issue #39): tiny >= 1.0x torch.
2. Instruction throughput on one thread: 16 independent `vdpbf16ps zmm` chains against 16 `vfmadd231ps zmm` ones
   (G instructions a second and GFLOPS: a vdpbf16ps is 64 flops, an FMA 32), where the probe confirms AVX512-BF16:
   whether an AVX512-BF16 kernel could beat the float32 FMA one on this CPU.

`python bench/bench_bf16.py [N ...]` (default 1024; e.g. `1024 4096`) prints the rows, the CPU's name and `uptime`'s
load; `run()` returns them for bench/run.py.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from settle import time_in_turns  # noqa: E402

os.environ.setdefault("DEV", "CPU")
N = 1024
ROUNDS, REPS = 3, 5
MICRO_ITERS = 2_000_000


def _bf16_bits(x: np.ndarray) -> np.ndarray:
  b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """The float32 product of a and b rounded to bfloat16 (the values every library multiplies)."""
  return (_bf16_bits(a).astype(np.uint32) << 16).view(np.float32) @ (_bf16_bits(b).astype(np.uint32) << 16).view(
    np.float32)


def _check(got: np.ndarray, want: np.ndarray, who: str) -> None:
  if not np.allclose(got, want, rtol=0, atol=2 ** -7 * float(np.abs(want).max())):
    raise AssertionError(f"{who} bfloat16 matmul is wrong")


def tiny_bf16(n: int) -> Callable[[], Any]:
  from tiny_tensor import Tensor, dtypes
  a, b = _inputs(n)
  ta, tb = Tensor(a).cast(dtypes.bfloat16).realize(), Tensor(b).cast(dtypes.bfloat16).realize()
  _check((ta @ tb).float().numpy(), _exact(a, b), "tiny")
  return lambda: (ta @ tb).realize()


def torch_bf16(n: int) -> Callable[[], Any]:
  import torch
  a, b = (torch.from_numpy(x).bfloat16() for x in _inputs(n))
  return lambda: a @ b


def _cpu_program(name: str, src: str) -> Any:
  from tiny_codegen.compiler.llvm import LLVMCompiler
  from tiny_runtime_cpu.cpu import CPUProgram
  from tiny_uop.plugins import Device
  return CPUProgram(Device["CPU"], name, LLVMCompiler().compile(src))


def tiny_amx(n: int) -> Callable[[], Any] | None:
  """The AMX tile kernel on the CPU runtime's threads, or None where the tiles don't run (or the shape doesn't fit)."""
  from tiny_codegen import x86_amx
  from tiny_uop.plugins import Device
  if not x86_amx.request_tile_state(): return None
  threads = getattr(Device["CPU"].renderer, "threads", 1)
  if n % (x86_amx.BLOCK * threads) or n % x86_amx.BLOCK: return None
  a, b = _inputs(n)
  ab, bb = np.ascontiguousarray(_bf16_bits(a)), _bf16_bits(b)
  bp = np.ascontiguousarray(bb)  # B (K, N) row-major: the kernel packs its k-pairs itself
  out = np.zeros((n, n), np.float32)
  prg = _cpu_program("amx_mm", x86_amx.amx_bf16_matmul_ir(n, n, n, threads, name="amx_mm"))
  bufs = (out, ab, bp)  # the closure holds the arrays, not only their addresses: freed, they'd be unmapped

  def call() -> None: prg(*(x.ctypes.data for x in bufs), global_size=(threads, 1, 1))
  call()
  _check(out, _exact(a, b), "tiny_amx")
  return call


def tiny_dp(n: int) -> Callable[[], Any] | None:
  """The AVX512-BF16 kernel on the CPU runtime's threads, or None where the probe doesn't confirm the instruction."""
  from tiny_codegen import x86_amx, x86_bf16
  from tiny_codegen.machine import machine_of
  from tiny_uop.plugins import Device
  mach, threads = machine_of(Device["CPU"].renderer), getattr(Device["CPU"].renderer, "threads", 1)
  if not x86_bf16.usable(mach) or (blk := x86_bf16.plan(mach, n, n, n, threads, x86_amx.thread_stack_limit())) is None:
    return None
  a, b = _inputs(n)
  bufs = (np.zeros((n, n), np.float32), np.ascontiguousarray(_bf16_bits(a)), np.ascontiguousarray(_bf16_bits(b)))
  prg = _cpu_program("dp_mm", x86_bf16.avx512_bf16_matmul_ir(n, n, n, threads, name="dp_mm", mr=blk[0], nv=blk[1]))

  def call() -> None: prg(*(x.ctypes.data for x in bufs), global_size=(threads, 1, 1))
  call()
  _check(bufs[0], _exact(a, b), "tiny_dp")
  return call


def _micro_ir(kind: str) -> str:
  """16 independent accumulator chains of `kind` ("dp": vdpbf16ps, "fma": vfmadd231ps) over MICRO_ITERS steps."""
  ln = ["declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)",
        "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
        f"define void @{kind}(ptr noalias %out, ptr noalias %x, i32 %core_id) #0 {{", "entry:",
        "  %xv = load <16 x float>, ptr %x, align 4", "  %yv = bitcast <16 x float> %xv to <32 x bfloat>",
        "  br label %h", "h:", "  %i = phi i32 [0, %entry], [%i.n, %h]"]
  ln += [f"  %a{j} = phi <16 x float> [%xv, %entry], [%n{j}, %h]" for j in range(16)]
  for j in range(16):
    ln.append(f"  %n{j} = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %a{j}, <32 x bfloat> %yv, "
              "<32 x bfloat> %yv)" if kind == "dp" else
              f"  %n{j} = call <16 x float> @llvm.fma.v16f32(<16 x float> %a{j}, <16 x float> %xv, <16 x float> %xv)")
  ln += ["  %i.n = add i32 %i, 1", f"  %c = icmp slt i32 %i.n, {MICRO_ITERS}", "  br i1 %c, label %h, label %e", "e:"]
  for j in range(16):
    ln += [f"  %p{j} = getelementptr inbounds <16 x float>, ptr %out, i32 {j}",
           f"  store <16 x float> %n{j}, ptr %p{j}, align 4"]
  return "\n".join(ln + ["  ret void", "}", 'attributes #0 = { nounwind "target-features"="+avx512f,+avx512bf16" }'])


def dp_vs_fma() -> dict[str, float] | None:
  """G instructions a second of vdpbf16ps and vfmadd231ps zmm on one thread (in turns, best of 3 rounds x 3), or None
  where the probe doesn't confirm AVX512-BF16."""
  from tiny_codegen import cpu_probe
  if not cpu_probe.executes("avx512_bf16"): return None
  out, x = np.zeros(256, np.float32), np.full(16, 1e-3, np.float32)
  prgs = {k: _cpu_program(k, _micro_ir(k)) for k in ("dp", "fma")}
  fns = {k: (lambda p=p: p(out.ctypes.data, x.ctypes.data)) for k, p in prgs.items()}
  return {k: MICRO_ITERS * 16 / min(t) / 1e9 for k, t in time_in_turns(fns, ROUNDS, 3).items()}


def run(sizes: tuple[int, ...] = (N,), micro: bool = True) -> dict[str, dict[str, Any]]:
  """One GFLOPS row per size in `sizes` (tiny, torch where importable, tiny_amx where the tiles run, tiny_dp where
  AVX512-BF16 does), then the instruction throughput row when `micro` (and the probe confirms AVX512-BF16)."""
  out: dict[str, dict[str, Any]] = {}
  for n in sizes:
    fns: dict[str, Callable[[], Any]] = {"tiny": tiny_bf16(n)}
    try: fns["torch"] = torch_bf16(n)
    except ImportError: pass
    if (amx := tiny_amx(n)) is not None: fns["tiny_amx"] = amx
    if (dp := tiny_dp(n)) is not None: fns["tiny_dp"] = dp
    row: dict[str, Any] = {"unit": "GFLOPS", "better": "higher", "target": "tiny >= 1.0x torch (issue #39)"}
    row.update({k: 2 * n ** 3 / min(t) / 1e9 for k, t in time_in_turns(fns, ROUNDS, REPS).items()})
    out[f"matmul {n}x{n} bfloat16 (float32 sums)"] = row
  if micro and (rates := dp_vs_fma()) is not None:
    out["1 thread, 16 zmm chains: G instructions/s"] = {"unit": "G/s", "better": "higher",
                                                         "target": "(a ceiling, no target)", **rates}
    out["1 thread, 16 zmm chains: GFLOPS"] = {"unit": "GFLOPS", "better": "higher", "target": "(a ceiling, no target)",
                                              "dp": rates["dp"] * 64, "fma": rates["fma"] * 32}
  return out


if __name__ == "__main__":
  from bench_matmul import cpu_name
  print(cpu_name(), "load", os.getloadavg())
  for case, r in run(tuple(int(a) for a in sys.argv[1:]) or (N,)).items():
    print(case, "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
  print("load", os.getloadavg())
  sys.exit(0)
