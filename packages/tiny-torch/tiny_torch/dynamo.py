"""`torch.compile(model, backend="tiny")`: TorchDynamo's FX graphs run as tiny kernels, captured once by TinyJit.

The stages, for each graph Dynamo hands over (a graph break hands over several, and the Python between them runs as
usual):
1. `tiny_backend` gives the graph to AOTAutograd (`aot_module_simplified`) with tiny_torch's decompositions: it
   traces a functional aten forward graph and, when anything requires grad, a backward graph (training works:
   `loss.backward()` runs the backward graph). Mutations (BatchNorm running stats) come out as extra outputs that
   AOTAutograd copies back into the inputs.
2. `compile_graph` turns one aten graph into a function over tiny Tensors: the graph runs on TinyTensors (so every
   aten op means what it means on the `tiny` device, views included), with CPU constants and `device=cpu` factory
   arguments moved to tiny.
3. That function runs under a TinyJit per input signature (shapes, dtypes and the Python ints of dynamic shapes):
   call 1 eager, call 2 captures, later calls replay the kernels. A graph with dynamic sizes (SymInt inputs) whose
   ops all take symbolic sizes runs instead over tiny Variables (`tiny_torch.symbolic`): one capture serves every
   size of a power-of-two bucket; otherwise (the reason logged at debug level on the "tiny_torch.dynamo" logger, kept
   in `CompiledGraph.symbolic_fallback`) each size is its own signature, eager once, then captured. A graph that
   draws random numbers or reads data to the host (`.item()`, `nonzero`) is not jitted: a replay would repeat the
   first draw, or skip the read.
4. Inputs on the CPU (a model left on the CPU) are copied to tiny and outputs copied back.

Code whose inputs are already TinyTensors (`torch.compile(model.to("tiny"))`) is not traced: it graph-breaks and the
ops run eagerly on `tiny` (correct, not compiled; tests/test_compile.py checks it). Compile a model that lives on the
CPU. Why this can't be fixed in tiny_torch with torch 2.13 (checked, not assumed):
- Dynamo traces a tensor argument only when its class keeps torch's own `__torch_dispatch__` or is a traceable
  wrapper subclass (`__tensor_flatten__`/`__tensor_unflatten__`); any other subclass becomes an opaque Python object
  and its first op graph-breaks ("Dynamo does not know how to trace builtin operator `matmul` with argument types
  ['TinyTensor', 'TinyTensor']").
- Keeping torch's `__torch_dispatch__` (and serving the ops from a PrivateUse1 fallback kernel instead) is refused:
  `_make_wrapper_subclass` raises "TinyTensor must define __torch_dispatch__"; a PrivateUse1 tensor with a real
  TensorImpl needs an allocator registered from C++ (an extension: tiny-torch is pure Python).
- A traceable wrapper subclass is desugared by AOTAutograd into the inner torch Tensors its `__tensor_flatten__`
  names: the subclass's `__torch_dispatch__` is traced over fake inner tensors into torch ops on them, and the
  compiled graph runs on the inner tensors. A TinyTensor's elements are a tiny Tensor, not a torch Tensor, and its
  dispatch runs tiny code, so there is no inner tensor to flatten to and no torch op to trace.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import torch
from tiny_tensor import Tensor, TinyJit

from tiny_torch import backend as B
from tiny_torch.symbolic import SymbolicGraph

log = logging.getLogger("tiny_torch.dynamo")

NAME = "tiny"


def _decompositions() -> dict[Any, Callable[..., Any]]:
  from tiny_torch import ops
  return dict(ops.DECOMPS)


def _jittable(gm: torch.fx.GraphModule) -> bool:
  """Whether every call of the graph runs the same kernels on new inputs (no random draws, no host reads)."""
  from tiny_torch import ops
  for node in gm.graph.nodes:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload): continue
    t = node.target
    if torch.Tag.nondeterministic_seeded in t.tags or t in ops.NO_META or t in ops.SPECIAL and t not in (
        torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default): return False
  return True


def _to_tiny_graph(gm: torch.fx.GraphModule, index: int) -> None:
  """Point the graph's factory calls and tensor constants at tiny:index instead of the CPU (in place)."""
  dev = torch.device(B.BACKEND, index)
  for node in gm.graph.nodes:
    if node.op == "call_function" and isinstance(node.kwargs.get("device"), torch.device) and \
        node.kwargs["device"].type == "cpu":
      node.kwargs = {**node.kwargs, "device": dev}
    if node.op == "get_attr":
      val = getattr(gm, node.target)
      if isinstance(val, torch.Tensor) and not isinstance(val, B.TinyTensor):
        setattr(gm, node.target, B.from_torch(val.detach(), index))
  gm.recompile()


class CompiledGraph:
  """One aten graph as a callable over torch tensors (see the module docstring, stages 2-4)."""
  instances: weakref.WeakSet[CompiledGraph]  # every live one (tests count graphs and replays)

  def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], n_user: int | None = None) -> None:
    tiny_in = [x for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type == B.BACKEND]
    self.index = (tiny_in[0].device.index or 0) if tiny_in else 0
    self.on_cpu = not tiny_in
    _to_tiny_graph(gm, self.index)
    self.gm = gm
    self.jit = _jittable(gm)
    self.jits: dict[tuple, TinyJit] = {}
    # per input signature: output -> (input, sizes, strides, offset) for the outputs that are (views of) inputs (their
    # sizes change with the inputs' when the sizes are dynamic)
    self.aliases: dict[tuple, dict[int, tuple]] = {}
    self.computed: list[int] = []
    self.other: dict[int, Any] = {}
    self.n_out = 0
    self.n_user = n_user  # outputs the caller sees; a forward graph's others are saved for backward: they stay on tiny
    # dynamic sizes: one capture over tiny Variables where the graph allows (tiny_torch.symbolic), else why not
    self.symbolic: SymbolicGraph | None = None
    self.symbolic_fallback = ""
    if self.jit and any(isinstance(x, torch.SymInt) for x in example_inputs):
      self.symbolic, self.symbolic_fallback = SymbolicGraph.plan(gm, list(example_inputs))
      if self.symbolic is None:
        log.debug("tiny_torch: graph with dynamic sizes falls back to a TinyJit capture per size: %s",
                  self.symbolic_fallback)
    CompiledGraph.instances.add(self)

  def _graph(self, args: tuple) -> tuple[list[Any], list[Any]]:
    wrapped = [B.wrap(a) if isinstance(a, Tensor) else a for a in args]
    with torch.no_grad():
      outs = self.gm(*wrapped)
    return wrapped, list(outs) if isinstance(outs, (tuple, list)) else [outs]

  def _run_tiny(self, *args: Any) -> tuple[Tensor, ...]:
    """The graph's computed outputs (not those that are inputs or views of them), contiguous and realized."""
    _, outs = self._graph(args)
    res = tuple(B.read(outs[k]).contiguous() for k in self.computed)
    if res: Tensor.realize(*res)
    return res

  @staticmethod
  def _signature(args: tuple) -> tuple:
    """What a TinyJit capture depends on: the tensors' shapes and dtypes, the Python values (dynamic sizes)."""
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, Tensor) else a if isinstance(a, (int, float, bool))
                 else type(a).__name__ for a in args)

  def _first(self, args: tuple, key: tuple) -> list[Any]:
    """Run eagerly and note which outputs are (views of) inputs: TinyJit can't return those, they are rebuilt from
    the inputs on every call of this signature."""
    wrapped, outs = self._graph(args)
    storages = {id(w._st): j for j, w in enumerate(wrapped) if isinstance(w, B.TinyTensor)}
    alias: dict[int, tuple] = {}
    self.computed, self.other = [], {}
    for k, o in enumerate(outs):
      if isinstance(o, B.TinyTensor) and id(o._st) in storages:
        alias[k] = (storages[id(o._st)], tuple(o.shape), tuple(o.stride()), o.storage_offset())
      elif isinstance(o, B.TinyTensor): self.computed.append(k)
      else: self.other[k] = o
    self.n_out = len(outs)
    self.aliases[key] = alias
    return [B.read(o).contiguous() if isinstance(o, B.TinyTensor) else o for o in outs]

  def __call__(self, *args: Any) -> Any:
    tiny_args = self._inputs(args)
    if self.symbolic is not None:
      return [self._out(o, k) for k, o in enumerate(self.symbolic(tiny_args))]
    key = self._signature(tiny_args)
    if key not in self.aliases: return [self._out(o, k) for k, o in enumerate(self._first(tiny_args, key))]
    if self.jit and all(isinstance(a, (Tensor, int, float, bool)) for a in tiny_args) and self.computed:
      fn = self.jits.setdefault(key, TinyJit(self._run_tiny))
      computed = fn(*tiny_args)
    else: computed = self._run_tiny(*tiny_args) if self.computed else ()
    outs: list[Any] = [None] * self.n_out
    for k, v in zip(self.computed, computed): outs[k] = v
    for k, v in self.other.items(): outs[k] = v
    for k, (j, size, stride, off) in self.aliases[key].items():
      src = tiny_args[j]
      outs[k] = B.read(B.TinyTensor(B.Storage(src.reshape(src.numel())), size, stride, off,
                                    B.TINY_TO_TORCH[src.dtype], self.index))
    return [self._out(o, k) for k, o in enumerate(outs)]

  def _inputs(self, args: tuple) -> tuple[Any, ...]:
    """The arguments as realized tiny Tensors (one schedule for all of them), each its own buffer: TinyJit takes a
    buffer once, so one passed twice (two saved activations over the same storage) is copied."""
    ts = [B.read(a).contiguous() if isinstance(a, B.TinyTensor) else
          B.read(B.from_torch(a, self.index, realize=False)) if isinstance(a, torch.Tensor) else a for a in args]
    if tensors := [t for t in ts if isinstance(t, Tensor)]: Tensor.realize(*tensors)
    seen: set[Any] = set()
    for k, t in enumerate(ts):
      if not isinstance(t, Tensor): continue
      if t.uop in seen: ts[k] = t = t.clone().realize()  # (realized nodes are interned: one node, one buffer)
      seen.add(t.uop)
    return tuple(ts)

  def _out(self, o: Any, k: int) -> Any:
    if not isinstance(o, Tensor): return o
    w = B.wrap(o)
    return B.to_cpu(w) if self.on_cpu and (self.n_user is None or k < self.n_user) else w


CompiledGraph.instances = weakref.WeakSet()


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
  """AOTAutograd's backward (and inference) compiler: an aten graph to a boxed callable running it on tiny."""
  from torch._functorch.aot_autograd import make_boxed_func
  return make_boxed_func(CompiledGraph(gm, list(example_inputs)))


def compile_forward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
  """AOTAutograd's forward compiler: like `compile_graph`, but the activations it saves for the backward graph (the
  outputs after AOTAutograd's `num_forward_returns`) stay on tiny instead of being copied to the CPU and back."""
  from torch._functorch.aot_autograd import make_boxed_func
  ctx = torch._guards.TracingContext.try_get()
  meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
  n_user = getattr(meta, "num_forward_returns", None)
  return make_boxed_func(CompiledGraph(gm, list(example_inputs), n_user))


def tiny_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
  """The `torch.compile` backend "tiny": `torch.compile(model, backend="tiny")`.

  >>> import torch, tiny_torch
  >>> f = torch.compile(lambda x: (x * 2).sum(), backend="tiny")
  >>> f(torch.ones(3)).item()
  6.0
  """
  from torch._functorch.aot_autograd import aot_module_simplified
  return aot_module_simplified(gm, example_inputs, fw_compiler=compile_forward, bw_compiler=compile_graph,
                               decompositions=_decompositions())


def register_backend() -> None:
  """Register `tiny_backend` with TorchDynamo as "tiny" (the entry point does the same for an installed wheel)."""
  from torch._dynamo.backends.registry import _BACKENDS, register_backend as reg
  if NAME not in _BACKENDS or _BACKENDS[NAME] is None: reg(tiny_backend, name=NAME)
