"""Whole ONNX models through `tiny_tensor.nn.onnx.OnnxRunner`, under TinyJit (`jit=True`) and eagerly, next to
onnxruntime and torch (eager, no_grad) on the same CPU: the median time of one inference (batch 1), in ms.

Models (random weights, exported with `torch.onnx.export(..., dynamo=False)`, the TorchScript exporter, which works
offline and needs no onnxscript; static shapes):
- resnet18, mobilenet_v3_small, efficientnet_b0: defined here with torchvision's layer layout (torchvision's wheels
  here need torch 2.14, not this project's 2.13), images `BENCH_MODELS_IMAGE` pixels square (default 224);
- a tiny BERT (transformers `BertModel`: 2 layers, width 128, 2 heads, 64 tokens) and a tiny GPT-2 (`GPT2Model`:
  2 layers, width 128, 2 heads, 64 tokens, an all-ones attention mask as a second input).
Each model's tiny outputs (jit and eager) are checked against onnxruntime's (assert close) before anything is timed.

Rows per model: median ms per inference over about `BENCH_MODELS_RUNS` (default 10) calls after warm-up, or as many as
fill `TURN_S` a round (a 1 ms model's median of a few calls was one preempted call's), the four taking turns (`TURNS`
rounds, `settle.time_in_turns`, so a burst of other load hits every side), `tiny` (jit: the replayed capture),
`tiny_eager` (`OnnxRunner(path)`, jit off: from its third call on, a repeated input signature replays the kernels its
second call recorded, with fresh outputs each call; see OnnxRunner's doc, "Eager calls"; its first three calls are
checked), `onnxruntime`, `torch`; the seconds tiny's jit needs for its first three calls (compile, capture, first
replay); and the kernels one replay of the capture launches. The CPU (lscpu's model name) is in every row's target
text.

Dynamic sequence length (issue #39): the tiny BERT and GPT-2 exported with a dynamic `seq` axis run through one
`OnnxRunner(jit=True, max_dims={"seq": 128})` at `BENCH_MODELS_SEQS` lengths (default 32,64): per length, ms per
inference next to onnxruntime, the kernels compiled by that length's first two calls (0 after the first length when
one symbolic capture serves them all) and the captures the runner holds.

`python bench/bench_models.py [model ...]` prints the rows; `run()` returns them (needs onnx, onnxruntime, torch and
transformers: `pip install onnxruntime` is a bench-only dependency).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, also when this file is loaded by path
from settle import time_in_turns  # noqa: E402

os.environ.setdefault("DEV", "CPU")

RUNS = int(os.environ.get("BENCH_MODELS_RUNS", 10))
TURNS = 3  # rounds of `time_in_turns` the RUNS calls of each side are spread over
TURN_S = 0.1  # and each side's timed calls in a round fill at least this long (a fast model gets more than RUNS)
IMAGE = int(os.environ.get("BENCH_MODELS_IMAGE", 224))
MODELS = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "bert_tiny", "gpt2_tiny"]
SEQS = [int(v) for v in os.environ.get("BENCH_MODELS_SEQS", "32,64").split(",") if v]


def cpu_name() -> str:
  """The CPU's model name as lscpu reports it."""
  try: out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError): return "unknown CPU (lscpu failed)"
  names = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")]
  return names[0] if names else "unknown CPU"


# ***** the vision models (torchvision's layouts, written out) *****
def _resnet18() -> Any:
  import torch.nn as nn

  class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
      super().__init__()
      self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
      self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
      self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
        if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: Any) -> Any:
      return (self.b2(self.c2(self.b1(self.c1(x)).relu())) + self.down(x)).relu()

  layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.MaxPool2d(3, 2, 1)]
  cin = 64
  for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
    layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
    cin = cout
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


def _se(nn: Any, c: int, squeeze: int, act: Any, gate: Any) -> Any:
  class SE(nn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.f1, self.f2, self.act, self.gate = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1), act(), gate()

    def forward(self, x: Any) -> Any: return x * self.gate(self.f2(self.act(self.f1(x.mean((2, 3), keepdim=True)))))
  return SE()


def _inverted(nn: Any, cin: int, mid: int, cout: int, k: int, stride: int, act: Any, se: Any) -> Any:
  """An inverted residual block (expand 1x1, depthwise kxk, optional squeeze-excite, project 1x1)."""
  class Inv(nn.Module):
    def __init__(self) -> None:
      super().__init__()
      parts = [] if mid == cin else [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), act()]
      parts += [nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), act()]
      if se is not None: parts.append(se(mid))
      parts += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
      self.body, self.res = nn.Sequential(*parts), stride == 1 and cin == cout

    def forward(self, x: Any) -> Any: return x + self.body(x) if self.res else self.body(x)
  return Inv()


def _mobilenet_v3_small() -> Any:
  import torch.nn as nn
  hs, re = nn.Hardswish, nn.ReLU
  def se(c: int) -> Any: return _se(nn, c, max(8, (c // 4 + 4) // 8 * 8), nn.ReLU, nn.Hardsigmoid)
  # (kernel, expanded, out, squeeze-excite, activation, stride): torchvision's mobilenet_v3_small table
  cfg = [(3, 16, 16, True, re, 2), (3, 72, 24, False, re, 2), (3, 88, 24, False, re, 1), (5, 96, 40, True, hs, 2),
         (5, 240, 40, True, hs, 1), (5, 240, 40, True, hs, 1), (5, 120, 48, True, hs, 1), (5, 144, 48, True, hs, 1),
         (5, 288, 96, True, hs, 2), (5, 576, 96, True, hs, 1), (5, 576, 96, True, hs, 1)]
  layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), hs()]
  cin = 16
  for k, mid, cout, use_se, act, stride in cfg:
    layers.append(_inverted(nn, cin, mid, cout, k, stride, act, se if use_se else None))
    cin = cout
  layers += [nn.Conv2d(96, 576, 1, bias=False), nn.BatchNorm2d(576), hs(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
             nn.Linear(576, 1024), hs(), nn.Dropout(0.2), nn.Linear(1024, 1000)]
  return nn.Sequential(*layers)


def _efficientnet_b0() -> Any:
  import torch.nn as nn
  # (expansion, out, repeats, stride, kernel): torchvision's efficientnet_b0 stages
  cfg = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
         (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]
  layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
  cin = 32
  for e, cout, n, stride, k in cfg:
    for i in range(n):
      sq = max(1, cin // 4)
      layers.append(_inverted(nn, cin, cin * e, cout, k, stride if i == 0 else 1, nn.SiLU,
                              lambda c, sq=sq: _se(nn, c, sq, nn.SiLU, nn.Sigmoid)))
      cin = cout
  layers += [nn.Conv2d(320, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
             nn.Flatten(), nn.Dropout(0.2), nn.Linear(1280, 1000)]
  return nn.Sequential(*layers)


# ***** the language models (transformers) *****
class _LastHidden:
  """Wraps a transformers model so the export sees tensors in and one tensor out."""

  @staticmethod
  def make(model: Any, with_mask: bool) -> Any:
    import torch

    class W(torch.nn.Module):
      def __init__(self) -> None:
        super().__init__()
        self.m = model

      def forward(self, ids: Any, mask: Any = None) -> Any:
        kw = {"attention_mask": mask, "use_cache": False} if with_mask else {}
        return self.m(input_ids=ids, **kw).last_hidden_state
    return W()


def _bert_tiny() -> Any:
  from transformers import BertConfig, BertModel
  cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=512, max_position_embeddings=128)
  return _LastHidden.make(BertModel(cfg), with_mask=False)


def _gpt2_tiny() -> Any:
  from transformers import GPT2Config, GPT2Model
  cfg = GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=2, n_positions=128)
  # an explicit all-ones attention mask: without one, transformers' packed-sequence detection uses aten::diff,
  # which the TorchScript exporter can't export
  return _LastHidden.make(GPT2Model(cfg), with_mask=True)


def _spec(name: str) -> tuple[Callable[[], Any], dict[str, np.ndarray]]:
  rng = np.random.default_rng(0)
  if name in ("bert_tiny", "gpt2_tiny"):
    ids = rng.integers(0, 1000, (1, 64)).astype(np.int64)
    feeds = {"ids": ids} if name == "bert_tiny" else {"ids": ids, "mask": np.ones_like(ids)}
    return (_bert_tiny if name == "bert_tiny" else _gpt2_tiny), feeds
  build = {"resnet18": _resnet18, "mobilenet_v3_small": _mobilenet_v3_small, "efficientnet_b0": _efficientnet_b0}
  if name not in build: raise ValueError(f"unknown model {name!r}; valid: {MODELS}")
  return build[name], {"x": rng.standard_normal((1, 3, IMAGE, IMAGE)).astype(np.float32)}


def _close(name: str, what: str, got: np.ndarray, want: np.ndarray) -> None:
  """Assert tiny's output matches onnxruntime's, relative to the output's scale (random weights: large values)."""
  scale = max(float(np.abs(want).max()), 1.0)
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale, err_msg=f"{name}: tiny {what} vs onnxruntime")


def export_model(name: str, path: str) -> tuple[Any, dict[str, np.ndarray]]:
  """Build model `name` (seeded random weights, eval mode) and export it to ONNX at `path` with static shapes; returns
  (the torch model, its feeds)."""
  import torch
  build, feeds = _spec(name)
  torch.manual_seed(0)
  model = build().eval()
  torch.onnx.export(model, tuple(torch.from_numpy(v) for v in feeds.values()), path, input_names=list(feeds),
                    output_names=["y"], dynamo=False, opset_version=17)
  return model, feeds


def bench_model(name: str, runs: int = RUNS) -> dict[str, float]:
  """Export model `name`, check tiny against onnxruntime, and time all four; {impl: ms, "first3_s": s}."""
  import onnxruntime as ort
  import torch
  from tiny_tensor.nn.onnx import OnnxRunner
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}.onnx")
    model, feeds = export_model(name, path)
    targs = tuple(torch.from_numpy(v) for v in feeds.values())
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    eager, jit = OnnxRunner(path), OnnxRunner(path, jit=True)
  want = sess.run(None, feeds)[0]
  w0 = time.perf_counter()
  outs = [jit(feeds)["y"].numpy() for _ in range(3)]  # run, capture, first replay
  first3 = time.perf_counter() - w0
  for i, o in enumerate(outs): _close(name, f"jit call {i + 1}", o, want)
  for i in range(3): _close(name, f"eager call {i + 1}", eager(feeds)["y"].numpy(), want)  # built, rebuilt, replayed
  with torch.no_grad():
    _close(name, "(torch itself)", model(*targs).numpy(), want)
    # in turns (`settle.time_in_turns`): timed one after the other, whichever side met a burst of other load read
    # slower (mobilenet_v3_small's jit 3.91 ms against its eager run's 2.37 on the Zen 4 VM; in turns 2.8 vs 3.0)
    fns = {"tiny": lambda: jit(feeds)["y"].numpy(), "tiny_eager": lambda: eager(feeds)["y"].numpy(),
           "onnxruntime": lambda: sess.run(None, feeds), "torch": lambda: model(*targs)}
    times = time_in_turns(fns, TURNS, max(1, -(-runs // TURNS)), min_s=TURN_S)
    row = {k: statistics.median(t) * 1e3 for k, t in times.items()}
  (fn,) = jit.jits.values()
  return {**row, "first3_s": first3, "kernels": float(fn.captured.kernel_count)}


def bench_dynamic(name: str, seqs: list[int] = SEQS, runs: int = RUNS) -> dict[str, dict[str, float]]:
  """Model `name` (bert_tiny or gpt2_tiny) exported with a dynamic sequence axis, through one jitted runner at each
  length of `seqs`: {seq: {"tiny": ms, "onnxruntime": ms, "compiles": kernels compiled by its first two calls,
  "captures": the runner's captures after it}}; outputs checked against onnxruntime at every length."""
  import onnxruntime as ort
  import tiny_codegen
  import torch
  from tiny_tensor.nn.onnx import OnnxRunner
  build, feeds = _spec(name)
  torch.manual_seed(0)
  model = build().eval()
  targs = tuple(torch.from_numpy(v) for v in feeds.values())
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, f"{name}_dyn.onnx")
    torch.onnx.export(model, targs, path, input_names=list(feeds), output_names=["y"], dynamo=False, opset_version=17,
                      dynamic_axes={k: {1: "seq"} for k in feeds} | {"y": {1: "seq"}})
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    jit = OnnxRunner(path, jit=True, max_dims={"seq": 128})
  count, real = [0], tiny_codegen.get_program

  def counting(*a: Any, **k: Any) -> Any:
    count[0] += 1
    return real(*a, **k)
  out: dict[str, dict[str, float]] = {}
  tiny_codegen.get_program = counting  # the engine calls it once per kernel it compiles
  try:
    for seq in seqs:
      f = {k: np.ascontiguousarray(v[:, :seq]) for k, v in feeds.items()}
      want, before = sess.run(None, f)[0], count[0]
      for i in range(2): _close(name, f"dynamic seq {seq} call {i + 1}", jit(f)["y"].numpy(), want)
      # in turns, each after `settle()` (timed right after onnxruntime's calls, tiny's two threads met its spinning
      # workers: bert_tiny's seq=64 read 0.5 or 1.7 ms from one process to the next)
      times = time_in_turns({"tiny": lambda f=f: jit(f)["y"].numpy(), "onnxruntime": lambda f=f: sess.run(None, f)},
                            TURNS, max(1, -(-runs // TURNS)), min_s=TURN_S)
      out[str(seq)] = {"tiny": statistics.median(times["tiny"]) * 1e3,
                       "onnxruntime": statistics.median(times["onnxruntime"]) * 1e3,
                       "compiles": float(count[0] - before), "captures": float(len(jit.jits))}
  finally: tiny_codegen.get_program = real
  return out


def run(models: list[str] | None = None) -> dict[str, dict[str, Any]]:
  """{model: row} for `models` (default: all, or the comma list in BENCH_MODELS)."""
  models = models or [m for m in os.environ.get("BENCH_MODELS", ",".join(MODELS)).split(",") if m]
  cpu = cpu_name()
  out: dict[str, dict[str, Any]] = {}
  for name in models:
    r = bench_model(name)
    out[f"{name} (ms/inference)"] = {k: r[k] for k in ("tiny", "tiny_eager", "onnxruntime", "torch")} | {
      "unit": "ms", "better": "lower", "target": f"tiny jit <= 1.0x onnxruntime, eager <= 3x (issue #39); {cpu}"}
    out[f"{name} jit first 3 calls (s)"] = {"tiny": r["first3_s"], "unit": "s", "better": "lower"}
    out[f"{name} jit kernels per replay"] = {"tiny": r["kernels"], "unit": "", "better": "lower"}
    if name in ("bert_tiny", "gpt2_tiny") and SEQS:
      for seq, d in bench_dynamic(name).items():
        out[f"{name} dynamic seq={seq} (ms/inference)"] = {"tiny": d["tiny"], "onnxruntime": d["onnxruntime"],
                                                           "unit": "ms", "better": "lower"}
        out[f"{name} dynamic seq={seq} kernels compiled"] = {
          "tiny": d["compiles"], "unit": "", "better": "lower",
          "target": f"0 after the first length (one capture); captures held: {int(d['captures'])}"}
  return out


if __name__ == "__main__":
  print(f"CPU: {cpu_name()}")
  for case, row in run(sys.argv[1:] or None).items():
    vals = {k: v for k, v in row.items() if isinstance(v, float)}
    ort_ms = vals.get("onnxruntime")
    ratios = "  ".join(f"{k}/ort={v / ort_ms:.2f}x" for k, v in vals.items() if ort_ms and k != "onnxruntime")
    print(f"{case:42s} " + "  ".join(f"{k}={v:.3g}" for k, v in vals.items()) + (f"   {ratios}" if ratios else ""))
