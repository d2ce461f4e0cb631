"""tiny_tensor.llm: GGUF files, GGML block decoding in kernels, tokenizers, generation against a numpy reference, the
constant kernel count of the jitted decode step, the CLI and the OpenAI-style server."""
import io
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import llm_ref
from tiny_uop.uop import Ops
from tiny_tensor import GlobalCounters, Tensor, dtypes, engine
from tiny_tensor.llm import LLM, Config, Tokenizer, Transformer, chat_prompt
from tiny_tensor.llm import quants
from tiny_tensor.llm import model as model_mod
from tiny_tensor.llm.gguf import BLOCK, GGMLType, dequantize, quantize, read_gguf, write_gguf

QUANTS = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K,
          GGMLType.Q6_K]
# byte offsets of the float16 fields of each block (scales and mins), per ggml-common.h
F16_FIELDS = {GGMLType.Q8_0: [0], GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0],
              GGMLType.Q5_1: [0, 2], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208]}


def _random_blocks(t, n_blocks, rng):
  """Random bytes everywhere, with finite random float16 values in the scale fields."""
  be, bb = BLOCK[t]
  raw = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
  for off in F16_FIELDS[t]:
    raw[:, off:off + 2] = (rng.standard_normal(n_blocks) * 0.1).astype(np.float16).view(np.uint8).reshape(-1, 2)
  return raw


@pytest.mark.parametrize("t", QUANTS, ids=lambda t: t.name)
def test_block_decoding_matches_ggml_reference(t):
  import gguf  # the gguf package's numpy dequantizers: an implementation of the block formats not written here
  raw = _random_blocks(t, 12, np.random.default_rng(int(t)))
  ref = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType(int(t))).reshape(-1)
  np.testing.assert_array_equal(dequantize(raw, t), ref)                              # our numpy codec
  np.testing.assert_array_equal(quants.dequantize(Tensor(raw), t).numpy(), ref)       # Tensor ops in a kernel


@pytest.mark.parametrize("t", QUANTS + [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_quantize_roundtrip(t):
  x = np.random.default_rng(1).standard_normal(BLOCK[t][0] * 8).astype(np.float32)
  raw = np.frombuffer(quantize(x, t), np.uint8)
  assert raw.size == x.size // BLOCK[t][0] * BLOCK[t][1]
  y = dequantize(raw, t)
  # error bounded by the format's resolution (4-bit formats: about 1/8 of the block's range)
  tol = {GGMLType.Q8_0: 0.01, GGMLType.Q6_K: 0.03, GGMLType.F16: 1e-3, GGMLType.BF16: 1e-2}.get(t, 0.15)
  assert np.abs(y - x).max() <= tol * np.abs(x).max(), (t, np.abs(y - x).max())
  np.testing.assert_array_equal(quants.dequantize(Tensor(raw), t).numpy(), y)


def test_gguf_write_read_roundtrip_and_gguf_package_agrees(tmp_path):
  import gguf
  kv = {"general.architecture": "llama", "a.int": 7, "a.big": 2**40, "a.float": 0.5, "a.bool": True,
        "a.strs": ["x", "yz"], "a.ints": [1, -2, 3], "a.floats": [0.25, 1.5]}
  ts = {"w": np.arange(64, dtype=np.float32).reshape(2, 32), "q": np.linspace(-1, 1, 256, dtype=np.float32)}
  path = tmp_path / "t.gguf"
  write_gguf(path, kv, ts, {"q": GGMLType.Q4_K})
  got_kv, got = read_gguf(path)
  assert {k: got_kv[k] for k in kv} == kv
  assert got["w"].shape == (2, 32) and got["w"].ggml_type == GGMLType.F32
  np.testing.assert_array_equal(got["w"].numpy(), ts["w"])
  assert got["q"].ggml_type == GGMLType.Q4_K and got["q"].raw.size == 144
  r = gguf.GGUFReader(str(path))
  assert {f.name for f in r.fields.values()} >= set(kv)
  assert str(bytes(r.fields["a.strs"].parts[r.fields["a.strs"].data[1]]), "utf-8") == "yz"
  rt = {t.name: t for t in r.tensors}
  assert list(rt["w"].shape) == [32, 2] and int(rt["q"].tensor_type) == int(GGMLType.Q4_K)
  np.testing.assert_array_equal(np.asarray(rt["q"].data).reshape(-1), got["q"].raw)
  with pytest.raises(ValueError, match="not a GGUF file"): read_gguf(b"NOPE" + bytes(40))
  with pytest.raises(ValueError, match="truncated"): read_gguf(path.read_bytes()[:-100])


def test_sentencepiece_tokenizer():
  toks, scores, types = llm_ref.vocab()
  tok = Tokenizer("llama", toks, scores, types, bos_id=1, eos_id=2)
  ids = tok.encode("the cat")
  assert ids[0] == 1 and [tok.piece(i) for i in ids[1:]] == ["▁the", "▁c", "a", "t"]  # best-scoring merges first
  assert tok.decode(ids) == "the cat"
  s = "héllo ✓"  # characters outside the vocabulary fall back to their UTF-8 bytes
  assert tok.decode(tok.encode(s)) == s and any(toks[i].startswith("<0x") for i in tok.encode(s))


def test_bpe_tokenizer():
  from tiny_tensor.llm.tokenizer import _bytes_to_unicode
  b2u = _bytes_to_unicode()
  base = [b2u[b] for b in range(256)]
  merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"]
  vocab = base + ["he", "ll", "hell", "hello", "Ġw", "Ġwo", "<|end|>"]
  types = [1] * (len(vocab) - 1) + [3]
  tok = Tokenizer("gpt2", vocab, types=types, merges=merges, eos_id=len(vocab) - 1, add_bos=False)
  ids = tok.encode("hello world<|end|>")
  assert [tok.piece(i) for i in ids] == ["hello", "Ġwo", "r", "l", "d", "<|end|>"]
  assert tok.decode(ids) == "hello world" and tok.decode(ids, skip_special=False) == "hello world<|end|>"


# every block format in one model (K-quant rows must be whole 256-element blocks: dim and hidden are 256)
MIXED = {"token_embd.weight": GGMLType.Q6_K, "attn_q.weight": GGMLType.Q4_K, "attn_k.weight": GGMLType.Q6_K,
         "attn_v.weight": GGMLType.Q8_0, "attn_output.weight": GGMLType.Q4_0, "ffn_gate.weight": GGMLType.Q5_K,
         "ffn_up.weight": GGMLType.Q4_1, "ffn_down.weight": GGMLType.Q5_0, "output.weight": GGMLType.Q8_0}


@pytest.fixture(scope="module", autouse=True)
def _float32_products():
  """Every test of this module runs on the float32 decode and prefill paths unless it turns the others on itself
  (`test_int8_activations_*`): a VNNI CPU's int8 activations (llama.cpp's) and AMX's bfloat16 prefill products move
  logits past the 1e-4 the float64 references are held to. Module-wide, so that no test's numbers depend on which
  tests ran before it (run alone with -k, or first on an xdist worker, two of them failed)."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(model_mod, "int8_dot_products", lambda device: False)
    mp.setattr(model_mod, "PREFILL_AMX", False)
    yield


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
  """The MIXED model, its weights and the LLM (float32 decode path: `_float32_products`), shared by the module: the
  LLM's jitted steps are compiled once."""
  path = str(tmp_path_factory.mktemp("llm") / "mixed.gguf")
  ws = llm_ref.make_model(path, dim=256, hidden=256, n_heads=4, n_kv=2, types=MIXED, seed=3)
  kv, ts = read_gguf(path)
  assert {ts[k].ggml_type for k in ts} >= set(MIXED.values())
  return path, ws, LLM.load(path)


def _check_generation(llm, ws, arch, prompt_text="the quick fox", n=5):
  prompt = llm.tokenizer.encode(prompt_text)
  llm.reset()
  out = list(llm.generate_ids(prompt, max_tokens=n))
  ref = list(prompt)
  for _ in range(n): ref.append(int(np.argmax(llm_ref.forward(ws, ref, arch=arch)[-1])))
  assert out == ref[len(prompt):]
  # logits, not only the argmax: the prompt pass and jitted steps at later positions
  llm.reset()
  np.testing.assert_allclose(llm.model.prefill(prompt).numpy(), llm_ref.forward(ws, prompt, arch=arch)[-1],
                             rtol=1e-4, atol=1e-4)
  seq = prompt + out[:3]
  for i in range(len(prompt), len(seq)): lg = llm.model.decode(seq[i], i)
  np.testing.assert_allclose(lg.numpy(), llm_ref.forward(ws, seq, arch=arch)[-1], rtol=1e-4, atol=1e-4)


def test_generation_matches_numpy_reference_all_block_formats(mixed):
  path, ws, llm = mixed
  _check_generation(llm, ws, "llama")


def test_qwen2_style_biases_and_neox_rope_tied_output(tmp_path):
  path = str(tmp_path / "q.gguf")
  ws = llm_ref.make_model(path, arch="qwen2", n_layers=1, tied=True, seed=4)
  _check_generation(LLM.load(path), ws, "qwen2")


def test_decode_refills_one_input_row(mixed):
  """Each decode copies its token's embedding row into the same input Tensor (no new buffer, Tensor or bound Variable
  per token); the logits of the last step are checked against the reference in `_check_generation`."""
  llm = mixed[2]
  llm.reset()
  llm.model.prefill([1, 40, 41])
  rows = []
  for pos, tok in ((3, 50), (4, 51), (5, 52)):
    llm.model.decode(tok, pos).numpy()
    rows.append(llm.model._row)
    np.testing.assert_array_equal(rows[-1].numpy(), llm.model.embed_rows([tok]).numpy())
  assert rows[0] is rows[1] is rows[2]
  with pytest.raises(ValueError, match="vocabulary"): llm.model.decode(llm.model.cfg.vocab_size, 6)


def test_decode_step_kernels_are_constant_and_deterministic(mixed):
  llm = mixed[2]
  llm.reset()
  llm.model.prefill([1, 40, 41])
  counts, programs = [], []
  for pos in range(3, 10):
    GlobalCounters.reset()
    llm.model.decode(50 + pos, pos).numpy()
    counts.append(GlobalCounters.kernel_count)
    programs.append(len(engine._program_cache))
  # call 1 runs eagerly, call 2 captures, calls 3+ replay the same kernels: nothing compiles after the capture
  assert len(set(counts)) == 1 and counts[0] > 0
  assert len(set(programs[1:])) == 1
  assert llm.model.step.captured is not None and llm.model.step.captured.kernel_count == counts[0]
  # the KV-cache writes: one kernel per cache whose loops cover the one new row (1, n_kv, hd), not the whole context
  cfg = llm.model.cfg
  caches = {id(engine.get_buffer(engine.buffer_view(c.uop)[0])) for lay in llm.model.layers
            for c in (lay.cache_k, lay.cache_v)}
  writes = [c for c in llm.model.step.captured.calls if getattr(c, "refs", None) and id(c.refs[0]) in caches]
  assert len(writes) == 2 * cfg.n_layers
  row = rf"[rE]_1_{cfg.n_kv_heads}_{cfg.hd}(n\d+)?"  # a kernel's name is its output shape
  assert all(re.fullmatch(row, c.name) for c in writes), [c.name for c in writes]
  llm.reset()
  a = list(llm.generate("the cat", max_tokens=6))
  llm.reset()
  assert list(llm.generate("the cat", max_tokens=6)) == a
  b = list(llm.generate("the cat", max_tokens=6, temperature=0.8, seed=1))
  llm.reset()
  assert list(llm.generate("the cat", max_tokens=6, temperature=0.8, seed=1)) == b


def test_decode_attention_indexes_the_cache_without_dividing_by_the_position(mixed):
  """The decode step's attention reads the KV cache (at a symbolic length) as strided views: no kernel divides or
  takes a modulo by anything but a constant. Expanding the keys to every query head and merging (n_kv, rep) into one
  axis made each key load an integer division by the symbolic length (the scores kernel: 160 us a layer, 0.05
  GFLOPS). The logits of the grouped form are checked against numpy by `_check_generation`."""
  llm = mixed[2]
  assert llm.model.cfg.n_heads > llm.model.cfg.n_kv_heads  # grouped-query attention: the case that expanded
  llm.reset()
  llm.model.prefill([1, 40, 41])
  for pos in range(3, 6): llm.model.decode(50 + pos, pos).numpy()
  bad = []
  for c in llm.model.step.captured.calls:
    if not getattr(c, "refs", None): continue
    spec = next(spec for key, (spec, prg) in engine._program_cache.items() if prg is c.prg)
    assert spec.uops, c.name
    bad += [(c.name, u.op.name, str(u.src[1].op)) for u in spec.uops
            if u.op.name in ("CDIV", "CMOD") and u.src[1].op.name != "CONST"]
  assert not bad, bad


def _kernel_ast(call):
  """The AST the engine compiled a captured kernel call's program from."""
  return next(key[0] for key, (spec, prg) in engine._program_cache.items() if prg is call.prg)


def test_decode_step_quantized_matvec_reads_only_the_packed_blocks(mixed):
  """Each quantized weight of the decode step is read by ONE kernel (the matvec: decoding fused with the dot
  product), which moves about the weight's packed bytes (plus the activations), and whose loads are all ungated:
  the nibble and 6-bit-scale unpacking are index math, not concatenations (a `cat` gated every load of the kernel
  by which half an element is in, and the Q4_K matvec ran 3x slower than the f32 one)."""
  from tiny_tensor.llm.model import QLinear
  llm = mixed[2]
  llm.reset()
  llm.model.prefill([1, 40, 41])
  for pos in range(3, 6): llm.model.decode(50 + pos, pos).numpy()
  calls = llm.model.step.captured.calls
  qlins = [lin for lay in llm.model.layers for lin in (lay.wq, lay.wk, lay.wv, lay.wo, lay.w_gate, lay.w_up,
                                                       lay.w_down) if isinstance(lin, QLinear)]
  qlins += [llm.model.output] if isinstance(llm.model.output, QLinear) else []
  assert {q.ggml_type for q in qlins} >= set(MIXED.values()) - {GGMLType.Q6_K}
  for q in qlins:
    raw = engine.get_buffer(engine.buffer_view(q.raw.uop)[0])
    readers = [c for c in calls if any(r is raw for r in getattr(c, "refs", []))]
    assert len(readers) == 1, (q.ggml_type.name, [c.name for c in readers])
    c, packed = readers[0], raw.nbytes
    # the rest: the activations (and, for v, the KV cache its kernel writes a row of: counted whole)
    others = sum(r.nbytes for r in c.refs if r is not raw and hasattr(r, "nbytes"))
    assert packed <= c.mem <= packed + others, (q.ggml_type.name, c.mem, packed, others)
    gated = [u for u in _kernel_ast(c).toposort() if u.op.name == "INDEX" and len(u.src) > 2]
    assert not gated, (q.ggml_type.name, c.name, len(gated))
    # the flops of one output element: about one multiply-add per weight element, not a float copy of the weight
    assert c.ops >= 2 * q.shape[0] * q.shape[1]


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q4_K], ids=lambda t: t.name)
def test_quantized_matvec_loop_order_reads_rows_contiguously(t, monkeypatch):
  """The CPU heuristics give a matvec over packed blocks a K unroll (each row's bytes read contiguously) and no
  upcast of the output rows (lanes a row of blocks apart, each gathering single bytes: Q8_0 ran ~2x slower); an f32
  matvec unrolls K into lane accumulators. Values checked against the gguf package's dequantization. The float32
  decode path (a CPU without VNNI: Q8_0 with int8 activations runs `x86_vnni`'s kernel, no heuristic)."""
  import gguf
  monkeypatch.setattr(model_mod, "int8_dot_products", lambda device: False)
  from tiny_codegen.opt import optimize_kernel
  from tiny_uop.plugins import Device
  from tiny_tensor.llm.model import Linear, QLinear
  from tiny_tensor.jit import TinyJit
  rng = np.random.default_rng(5)
  w, x = rng.standard_normal((64, 512), dtype=np.float32), rng.standard_normal((1, 1, 512), dtype=np.float32)
  raw = np.frombuffer(quantize(w, t), np.uint8)
  lin = QLinear(Tensor(raw.reshape(-1, BLOCK[t][1])).realize(), t, w.shape)
  step = TinyJit(lambda v: lin(v).realize())
  for _ in range(3): y = step(Tensor(x)).numpy()
  ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(w.shape)
  np.testing.assert_allclose(y.reshape(-1), ref @ x.reshape(-1), rtol=1e-5, atol=1e-4)
  (call,) = step.captured.calls
  opts = optimize_kernel(_kernel_ast(call), Device[call.device].renderer).arg.applied_opts
  assert any(o.op.name == "UNROLL" for o in opts) and not any(o.op.name == "UPCAST" for o in opts), opts
  flin = Linear(Tensor(w).realize())
  fstep = TinyJit(lambda v: flin(v).realize())
  for _ in range(3): fstep(Tensor(x))
  (fcall,) = fstep.captured.calls
  # an f32 matvec (x @ W.T, K a multiple of the vector) keeps one accumulator per K lane (heuristic `_dot_products`)
  fopts = optimize_kernel(_kernel_ast(fcall), Device[fcall.device].renderer).arg.applied_opts
  assert any(o.op.name == "UNROLL" and o.arg >= 4 for o in fopts), fopts


def test_context_limits_and_bad_files(tmp_path):
  path = str(tmp_path / "m.gguf")
  llm_ref.make_model(path, ctx=16, n_layers=1)
  llm = LLM.load(path)
  with pytest.raises(ValueError, match="context"): llm.model.prefill(list(range(3, 20)))
  with pytest.raises(ValueError, match="outside"): llm.model.decode(3, 16)
  with pytest.raises(ValueError, match="vocabulary"): llm.model.prefill([10**6])
  assert len(list(llm.generate_ids([1, 5], max_tokens=100))) == 15  # 2 + 14 fed fill the 16 positions
  bad = tmp_path / "bad.gguf"
  kv, _ = read_gguf(path)
  buf = io.BytesIO()
  write_gguf(buf, {k: v for k, v in kv.items() if k != "llama.block_count"}, {"x": np.zeros(4, np.float32)})
  bad.write_bytes(buf.getvalue())
  with pytest.raises(ValueError, match="block_count"): LLM.load(bad)
  buf = io.BytesIO()
  write_gguf(buf, kv, {"token_embd.weight": np.zeros((len(kv["tokenizer.ggml.tokens"]), 64), np.float32)})
  bad.write_bytes(buf.getvalue())
  with pytest.raises(ValueError, match=r"lacks 10 tensor\(s\).*output_norm.weight"): LLM.load(bad)


def test_cli_generates_from_a_local_gguf(tmp_path):
  path = str(tmp_path / "m.gguf")
  llm_ref.make_model(path, seed=7, n_layers=1)
  env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
  r = subprocess.run([sys.executable, "-m", "tiny_tensor.llm", "--model", path, "--prompt", "the cat",
                      "--max-tokens", "6", "--timing"], capture_output=True, text=True, env=env, timeout=300)
  assert r.returncode == 0, r.stderr
  want = "".join(LLM.load(path).generate("the cat", max_tokens=6))
  assert r.stdout == want + "\n" and want
  assert "tok/s" in r.stderr and "first token" in r.stderr
  r = subprocess.run([sys.executable, "-m", "tiny_tensor.llm", "--model", str(tmp_path / "nope.gguf")],
                     capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 2 and "can't load" in r.stderr


def _post(url, body):
  req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
  return urllib.request.urlopen(req, timeout=120)


def test_openai_style_server(tmp_path):
  from tiny_tensor.llm.serve import make_server
  path = str(tmp_path / "m.gguf")
  llm_ref.make_model(path, seed=9, n_layers=1)
  llm = LLM.load(path)
  want = "".join(llm.generate("the cat", max_tokens=5))
  srv = make_server(llm, "127.0.0.1", 0)
  th = threading.Thread(target=srv.serve_forever, daemon=True)
  th.start()
  base = f"http://127.0.0.1:{srv.server_address[1]}"
  try:
    models = json.load(urllib.request.urlopen(base + "/v1/models"))
    assert models["data"][0]["id"] == "m.gguf"
    page = urllib.request.urlopen(base + "/").read().decode()
    assert '<script src="chat.js">' in page and "<textarea" in page and "<script>" not in page
    assert "/v1/chat/completions" in urllib.request.urlopen(base + "/chat.js").read().decode()
    r = json.load(_post(base + "/v1/completions", {"prompt": "the cat", "max_tokens": 5}))
    assert r["object"] == "text_completion" and r["choices"][0]["text"] == want
    raw = _post(base + "/v1/completions", {"prompt": "the cat", "max_tokens": 5, "stream": True}).read().decode()
    events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]" and "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == want
    msgs = [{"role": "user", "content": "hi"}]
    chat_want = "".join(llm.chat(msgs, max_tokens=4))
    r = json.load(_post(base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 4}))
    assert r["choices"][0]["message"] == {"role": "assistant", "content": chat_want}
    raw = _post(base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "stream": True}).read().decode()
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == chat_want
    with pytest.raises(urllib.error.HTTPError) as e: _post(base + "/v1/completions", {"prompt": 3})
    assert e.value.code == 400 and "prompt" in json.load(e.value)["error"]["message"]
    with pytest.raises(urllib.error.HTTPError) as e: _post(base + "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert e.value.code == 400
  finally:
    srv.shutdown()
    srv.server_close()


def test_chat_prompt_formats():
  m = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
  assert chat_prompt(m, "{{<|im_start|>}}").endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
  assert chat_prompt(m, "<|start_header_id|>").endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
  assert chat_prompt(m, "[INST]") == "[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nhi [/INST]"
  assert chat_prompt(m, None) == "System: be brief\nUser: hi\nAssistant:"


def test_server_checks_requests_against_the_real_model(tmp_path):
  """A prompt longer than the context, top_k beyond the vocabulary: 400 before any stream; sampling options reach the
  model as `LLM.generate` takes them (same seed: the same text)."""
  from tiny_tensor.llm.serve import make_server
  path = str(tmp_path / "m.gguf")
  llm_ref.make_model(path, ctx=16, n_layers=1, seed=4)
  llm = LLM.load(path)
  want = "".join(llm.generate("the cat", max_tokens=4, temperature=0.9, top_k=5, seed=11))
  srv = make_server(llm, "127.0.0.1", 0)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  base = f"http://127.0.0.1:{srv.server_address[1]}"
  try:
    n_tokens = len(llm.tokenizer.encode("the cat " * 10))
    assert n_tokens > 16
    with pytest.raises(urllib.error.HTTPError) as e:
      _post(base + "/v1/completions", {"prompt": "the cat " * 10, "stream": True})
    err = json.load(e.value)["error"]
    assert e.value.code == 400 and err["param"] == "prompt" and f"{n_tokens} tokens" in err["message"]
    assert "context holds 16" in err["message"]
    with pytest.raises(urllib.error.HTTPError) as e:
      _post(base + "/v1/completions", {"prompt": "the", "top_k": llm.model.cfg.vocab_size + 1})
    assert e.value.code == 400 and json.load(e.value)["error"]["param"] == "top_k"
    r = json.load(_post(base + "/v1/completions", {"prompt": "the cat", "max_tokens": 4, "temperature": 0.9,
                                                   "top_k": 5, "seed": 11}))
    assert r["choices"][0]["text"] == want
  finally:
    srv.shutdown()
    srv.server_close()


# ***** architectures against transformers (issue #38): random tiny models written as llama.cpp's converter does *****
# longer than the sliding windows (4) and llama3's original context (8)
PROMPT = [1, 40, 51, 300, 77, 12, 290, 100, 5, 9]


def _check_against_transformers(tmp_path, case, qtype=None, n=8, **kw):
  model = llm_ref.hf_model(case, seed=11, **kw)
  path = str(tmp_path / f"{case}.gguf")
  llm_ref.write_hf_gguf(model, case, path, qtype)
  llm = LLM.load(path)
  np.testing.assert_allclose(llm.model.prefill(PROMPT).numpy(), llm_ref.hf_logits(model, PROMPT)[-1],
                             rtol=1e-4, atol=1e-4)
  ref = list(PROMPT)
  for _ in range(n): ref.append(int(np.argmax(llm_ref.hf_logits(model, ref)[-1])))
  llm.reset()
  assert list(llm.generate_ids(PROMPT, max_tokens=n, stop_ids=())) == ref[len(PROMPT):]
  # the jitted decode steps' logits at the last position
  llm.reset()
  llm.model.prefill(PROMPT)
  for i in range(len(PROMPT), len(ref)): lg = llm.model.decode(ref[i], i)
  np.testing.assert_allclose(lg.numpy(), llm_ref.hf_logits(model, ref)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["llama", "llama3_rope", "qwen2", "qwen3", "gemma", "gemma2", "gemma3"])
def test_architectures_match_transformers_f32(tmp_path, case):
  _check_against_transformers(tmp_path, case)


@pytest.mark.parametrize("case,qname,kw", [
  ("qwen2", "Q8_0", {}), ("qwen3", "Q4_0", {}),
  # K-quant rows are whole 256-element blocks: every matrix's input width is 256
  ("gemma2", "Q4_K", {"dim": 256, "hidden": 256, "head_dim": 64, "query_pre_attn_scalar": 64}),
  ("llama3_rope", "Q6_K", {"dim": 256, "hidden": 256})])
def test_architectures_match_transformers_quantized(tmp_path, case, qname, kw, monkeypatch):
  import gguf
  monkeypatch.setattr(model_mod, "int8_dot_products", lambda device: False)  # float32 activations: logits to 1e-4
  monkeypatch.setattr(model_mod, "PREFILL_AMX", False)  # and float32 prefill products
  _check_against_transformers(tmp_path, case, gguf.GGMLQuantizationType[qname], **kw)


@pytest.mark.parametrize("qname", ["Q8_0", "Q4_K"])
def test_int8_activations_match_transformers_greedy(tmp_path, qname, monkeypatch):
  """A Q8_0 / Q4_K model's one-token matvecs on a VNNI CPU quantize the activations to int8 per 32-block as llama.cpp
  does (`llm.quants.quantize_q8_act`): the greedy tokens are transformers' (float64, the file's dequantized weights),
  the logits within 2% of their largest magnitude (docs: "int8 activations"); so are a 32-token prefill chunk's,
  whose products run in bfloat16 on AMX or `vdpbf16ps` where the CPU has them (`model.prefill_bf16_kernel`)."""
  import gguf
  if not quants.int8_dot_products("CPU"): pytest.skip("no VNNI on this CPU: decode keeps float32 activations")
  # the real switches: the module-scoped `mixed` fixture turns both off while this module's tests run
  monkeypatch.setattr(model_mod, "int8_dot_products", quants.int8_dot_products)
  monkeypatch.setattr(model_mod, "PREFILL_AMX", True)
  model = llm_ref.hf_model("llama", seed=11, dim=256, hidden=256)
  path = str(tmp_path / "q.gguf")
  llm_ref.write_hf_gguf(model, "llama", path, gguf.GGMLQuantizationType[qname])
  llm = LLM.load(path)
  ref = list(PROMPT)
  for _ in range(8): ref.append(int(np.argmax(llm_ref.hf_logits(model, ref)[-1])))
  assert list(llm.generate_ids(PROMPT, max_tokens=8, stop_ids=())) == ref[len(PROMPT):]
  llm.reset()
  llm.model.prefill(PROMPT)
  for i in range(len(PROMPT), len(ref)): lg = llm.model.decode(ref[i], i).numpy()
  want = llm_ref.hf_logits(model, ref)[-1]
  err = float(np.abs(lg - want).max())
  assert 1e-6 < err < 0.02 * float(np.abs(want).max()), err  # > 0: the int8 path ran, not the float32 one
  long = (PROMPT * 4)[:33]  # one whole chunk and a token after it
  llm.reset()
  want = llm_ref.hf_logits(model, long)
  got = llm.model.prefill(long[:32]).numpy()
  assert float(np.abs(got - want[31]).max()) < 0.02 * float(np.abs(want[31]).max())
  kernel = model_mod.prefill_bf16_kernel("CPU", llm.model.chunk, 256, 256)
  assert all(lay.w_up.dense is not None and lay.w_up.dense.kernel == kernel for lay in llm.model.layers)


def _bf16(a):
  """float32 values rounded to bfloat16 (to nearest, ties to even), as float64."""
  u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
  return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def test_prefill_dense_weight_without_amx_tile_state_keeps_float32(monkeypatch):
  """Where the process may not use AMX tiles (no AMX, `TINY_CPU_PROBE=0`, a kernel that refuses the tile state) and
  has no `vdpbf16ps` kernel, `DenseWeight(amx=True)` keeps the float32 layout, with numpy's float32 numbers."""
  from tiny_codegen import x86_amx, x86_bf16
  from tiny_tensor.llm.model import DenseWeight
  monkeypatch.setattr(x86_amx, "request_tile_state", lambda: False)
  monkeypatch.setattr(x86_bf16, "usable", lambda m: False)
  assert model_mod.prefill_bf16_kernel("CPU", 32, 96, 64) is None
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
  assert not model_mod.prefill_amx("CPU", 32, 96, 64)
  d = DenseWeight(Tensor(w), 32, amx=True)
  assert not d.bf16 and d.w.dtype.itemsize == 4
  np.testing.assert_allclose(d(Tensor(x)).numpy(), x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


def test_prefill_dense_weight_on_amx_tiles_matches_numpy():
  """`DenseWeight(amx=True)`: where the CPU runs AMX tiles and the shape fits them, or runs `vdpbf16ps` (any shape),
  x @ W.T is numpy's product of x and W rounded to bfloat16 (float32 sums); a shape neither kernel takes (48 columns
  on AMX), or a call with other than the chunk's rows, falls back (float32 panels / the bfloat16 copy upcast) with
  numpy's numbers."""
  from tiny_tensor.llm.model import DenseWeight
  from tiny_uop.plugins import Device
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 16, 64)).astype(np.float32)
  for out in (96, 48):
    w = rng.standard_normal((out, 64)).astype(np.float32)
    d = DenseWeight(Tensor(w), 32, amx=True)
    assert d.bf16 == (d.kernel is not None) and (d.kernel == "amx") == (out % 32 == 0 and
                                                                       model_mod.prefill_amx("CPU", 32, out, 64))
    assert d.kernel == model_mod.prefill_bf16_kernel("CPU", 32, out, 64)
    # on AMX kept in the tile kernel's panels, read in place (no per-call pack of W.T's columns); for vdpbf16ps W.T
    assert d.packed == (d.kernel == "amx")
    if d.kernel == "avx512_bf16": assert d.w.shape == (64, out) and d.w.dtype == dtypes.bfloat16
    if d.packed: assert d.w.shape == (out // 32, 2, 32, 16, 2)
    got = d(Tensor(x)).numpy()
    assert got.shape == (2, 16, out)
    want = _bf16(x) @ _bf16(w).T if d.bf16 else x.astype(np.float64) @ w.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    few = d(Tensor(x[0, :5])).numpy()  # 5 rows: not the tile kernel's
    np.testing.assert_allclose(few, (x[0, :5].astype(np.float64) @ (_bf16(w) if d.bf16 else w.astype(np.float64)).T),
                               rtol=1e-5, atol=1e-5)
    # float32: laid out in two-vector panels even where a per-call copy wouldn't pay (96 x 64 is under the L2)
    f = DenseWeight(Tensor(w), 32)
    regs, width = getattr(Device["CPU"].renderer, "vector_registers", (0, 0))
    assert not f.bf16 and f.panel == (2 * width // 4 if regs and width >= 32 and out % (width // 2) == 0
                                      and out >= width else 0)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


def _kept_buffer(t):
  """The Buffer under a realized Tensor (a BUFFER, or a RESHAPE of one)."""
  u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
  return engine.get_buffer(u)


def _vdpbf16ps_here() -> bool:
  from tiny_codegen import x86_amx, x86_bf16
  from tiny_codegen.machine import host_machine
  return not x86_amx.request_tile_state() and x86_bf16.usable(host_machine())


@pytest.mark.parametrize("rows, out, inp", [(32, 96, 64), (32, 256, 768), (8, 48, 40)])
def test_prefill_dense_weight_on_vdpbf16ps_matches_numpy(rows, out, inp):
  """Where the AMX tiles don't run and `vdpbf16ps` does (Zen 4), `DenseWeight(amx=True)` keeps W.T in bfloat16 once
  and a chunk's product is `x86_bf16`'s kernel (its source calls the instruction), plus the rounding of x: numpy's
  product of x and W rounded to bfloat16 as on AMX, and the copy isn't made again per call."""
  from tiny_codegen import get_program
  from tiny_tensor.llm.model import DenseWeight
  from tiny_uop.plugins import Device
  if not _vdpbf16ps_here(): pytest.skip("this CPU runs AMX tiles or no vdpbf16ps")
  rng = np.random.default_rng(rows + out)
  x, w = rng.standard_normal((rows, inp)).astype(np.float32), rng.standard_normal((out, inp)).astype(np.float32)
  d = DenseWeight(Tensor(w), rows, amx=True)
  assert d.kernel == "avx512_bf16" and d.bf16 and not d.packed and d.panel == 0
  assert d.w.shape == (inp, out) and d.w.dtype == dtypes.bfloat16 and engine.is_realized(d.w.uop)
  kept = _kept_buffer(d.w)
  got = d(Tensor(x))
  srcs = [get_program(c.src[0], Device["CPU"].renderer).src for c in got.schedule().calls if c.src[0].op is Ops.SINK]
  assert len(srcs) == 2 and sum("avx512bf16.dpbf16ps" in s for s in srcs) == 1, [s[:80] for s in srcs]  # x's cast
  np.testing.assert_allclose(got.numpy(), _bf16(x) @ _bf16(w).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d(Tensor(x[::-1].copy())).numpy(), _bf16(x[::-1]) @ _bf16(w).T, rtol=1e-5, atol=1e-5)
  assert _kept_buffer(d.w) is kept


def test_prefill_on_vdpbf16ps_matches_float_reference_and_greedy(tmp_path, monkeypatch):
  """A Q4_K model's 32-token prefill chunk on `vdpbf16ps` (no AMX, AVX512-BF16): every quantized weight kept once in
  bfloat16 for it, the chunk's captured kernels read those copies in place (none made per chunk), the logits within
  what the AMX path's test allows (2% of the largest) of transformers' float64 on the dequantized weights, and the
  greedy tokens after the prompt the reference's (decode in float32 activations here)."""
  import gguf
  if not _vdpbf16ps_here(): pytest.skip("this CPU runs AMX tiles or no vdpbf16ps")
  monkeypatch.setattr(model_mod, "int8_dot_products", lambda device: False)
  monkeypatch.setattr(model_mod, "PREFILL_AMX", True)
  model = llm_ref.hf_model("llama", seed=5, dim=256, hidden=256)
  path = str(tmp_path / "q.gguf")
  llm_ref.write_hf_gguf(model, "llama", path, gguf.GGMLQuantizationType.Q4_K)
  llm = LLM.load(path)
  long = (PROMPT * 4)[:33]
  want = llm_ref.hf_logits(model, long)
  for _ in range(3):  # capture, replays: the same numbers from the same kept copies
    llm.reset()
    got = llm.model.prefill(long[:32]).numpy()
    err = float(np.abs(got - want[31]).max())
    assert 1e-6 < err < 0.02 * float(np.abs(want[31]).max()), err  # > 0: bfloat16 products ran, not float32
  dense = [lin.dense for lay in llm.model.layers for lin in (lay.wq, lay.wk, lay.wv, lay.wo, lay.w_gate, lay.w_up,
                                                               lay.w_down)]
  assert all(d is not None and d.kernel == "avx512_bf16" and d.w.dtype == dtypes.bfloat16 for d in dense)
  cap = llm.model.chunk_step.captured
  assert cap is not None
  read = {id(r) for c in cap.calls for r in getattr(c, "refs", []) if not isinstance(r, int)}  # (ints: the inputs)
  assert read and all(id(_kept_buffer(d.w)) in read for d in dense if d is not None)
  ref = list(long[:32])
  for _ in range(4): ref.append(int(np.argmax(llm_ref.hf_logits(model, ref)[-1])))
  llm.reset()
  assert list(llm.generate_ids(long[:32], max_tokens=4, stop_ids=())) == ref[32:]


def test_packed_prefill_weight_is_lowered_where_the_tile_kernel_does_not_run(monkeypatch):
  """With CHECK_OOB on the tile kernel (no bounds checks) declines the registered product over the kept panels: it is
  lowered as usual from the panels' view, with numpy's numbers for the bfloat16-rounded x and W."""
  from tiny_tensor.llm.model import DenseWeight
  from tiny_uop.helpers import CHECK_OOB
  if not model_mod.prefill_amx("CPU", 32, 64, 96): pytest.skip("this CPU doesn't run AMX bfloat16 tiles")
  rng = np.random.default_rng(3)
  x, w = rng.standard_normal((32, 96)).astype(np.float32), rng.standard_normal((64, 96)).astype(np.float32)
  monkeypatch.setattr(CHECK_OOB, "value", 1)
  d = DenseWeight(Tensor(w), 32, amx=True)
  assert d.packed
  np.testing.assert_allclose(d(Tensor(x)).numpy(), _bf16(x) @ _bf16(w).T, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
  """A 2-layer llama file's metadata and tensors, for the checks of bad hyperparameters and tensors."""
  path = str(tmp_path_factory.mktemp("llm") / "small.gguf")
  llm_ref.make_model(path, n_layers=2)
  return read_gguf(path)


@pytest.mark.parametrize("key,value,match", [
  ("general.architecture", "phi3", r"'phi3' is not implemented; implemented: \['gemma', 'gemma2', 'gemma3', 'llama'"),
  ("llama.attention.layer_norm_rms_epsilon", 0.0, "layer_norm_rms_epsilon = 0.0; expected a positive"),
  ("llama.attention.layer_norm_rms_epsilon", float("nan"), "layer_norm_rms_epsilon = nan"),
  ("llama.rope.freq_base", -1.0, "freq_base = -1.0; expected a positive"),
  ("llama.block_count", 0, "block_count = 0; expected a positive integer"),
  ("llama.attention.head_count", -4, "head_count = -4"),
  ("llama.attention.head_count_kv", 3, "head_count 4 is not a multiple of head_count_kv 3"),
  ("llama.attention.head_count", 6, "embedding_length 64 is not a multiple of head_count 6"),
  ("llama.context_length", 0, "context_length = 0"),
  ("llama.embedding_length", "64", r"embedding_length = '64' \(str\); expected a positive integer"),
  ("llama.vocab_size", 0, "vocab_size = 0"),
  ("llama.feed_forward_length", True, "feed_forward_length = True"),
  ("llama.rope.scaling.type", "yarn", "'yarn' is not implemented"),
])
def test_bad_hyperparameters_are_refused_by_name(small_file, key, value, match):
  kv, ts = small_file
  with pytest.raises(ValueError, match=match): Config.from_gguf({**kv, key: value})


def test_unknown_missing_and_misshapen_tensors_are_refused_by_name(small_file):
  from tiny_tensor.llm.gguf import GGUFTensor
  kv, ts = small_file
  cfg = Config.from_gguf(kv)
  norm = ts["output_norm.weight"]
  def like(name, t=norm): return GGUFTensor(name, t.shape, t.ggml_type, t.raw)
  # a Qwen3-style q norm in a llama file, a block past block_count, a tensor of another architecture
  for extra in ["blk.0.attn_q_norm.weight", "blk.2.attn_norm.weight", "blk.01.attn_norm.weight", "pos_embd.weight"]:
    with pytest.raises(ValueError, match=rf"1 tensor\(s\) a llama model doesn't use: \[{re.escape(repr(extra))}\]"):
      Transformer(cfg, {**ts, extra: like(extra)})
  # a qwen3 file without its q/k norms: named as missing
  q3 = Config.from_gguf({**{k.replace("llama.", "qwen3."): v for k, v in kv.items()}, "general.architecture": "qwen3"})
  with pytest.raises(ValueError, match=r"lacks 4 tensor\(s\) a qwen3 model needs: \['blk.0.attn_q_norm.weight'"):
    Transformer(q3, ts)
  with pytest.raises(ValueError, match=r"'blk.0.ffn_gate.weight' has shape \(96, 64\), expected \(80, 64\)"):
    Transformer(Config.from_gguf({**kv, "llama.feed_forward_length": 80}), ts)
  with pytest.raises(ValueError, match=r"'rope_freqs.weight' has shape \(64,\), expected \(8,\)"):
    Transformer(cfg, {**ts, "rope_freqs.weight": like("rope_freqs.weight")})
  with pytest.raises(ValueError, match=r"'blk.0.attn_k.weight' has shape \(32, 64\), expected \(64, 64\)"):
    Transformer(Config.from_gguf({**kv, "llama.attention.head_count_kv": 4}), ts)
  zeros = GGUFTensor("rope_freqs.weight", (8,), GGMLType.F32, np.zeros(8, np.float32).view(np.uint8))
  with pytest.raises(ValueError, match="rope_freqs.weight holds non-positive"):
    Transformer(cfg, {**ts, zeros.name: zeros})


def test_gemma_sliding_window_patterns(small_file):
  kv, _ = small_file
  g3 = {**{k.replace("llama.", "gemma3."): v for k, v in kv.items()}, "general.architecture": "gemma3",
        "gemma3.attention.sliding_window": 4}
  assert [Config.from_gguf(g3).sliding(i) for i in range(2)] == [True, True]   # every 6th layer is global
  pat = "gemma3.attention.sliding_window_pattern"
  assert [Config.from_gguf({**g3, pat: 2}).sliding(i) for i in range(2)] == [True, False]
  assert [Config.from_gguf({**g3, pat: [False, True]}).sliding(i) for i in range(2)] == [False, True]
  with pytest.raises(ValueError, match=r"sliding_window_pattern has 3 flags for 2 layers"):
    Config.from_gguf({**g3, pat: [True, True, False]})
  with pytest.raises(ValueError, match=r"sliding_window_pattern = \[1, 0\]; expected"):
    Config.from_gguf({**g3, pat: [1, 0]})
  assert not Config.from_gguf({k: v for k, v in g3.items() if k != "gemma3.attention.sliding_window"}).sliding(0)


def test_a_huge_block_count_is_refused_before_listing_tensors(small_file):
  import time
  kv, ts = small_file
  cfg = Config.from_gguf({**kv, "llama.block_count": 10**8})
  t0 = time.perf_counter()
  with pytest.raises(ValueError, match=r"block_count = 100000000, but the file holds only 21 tensors"):
    Transformer(cfg, ts)
  assert time.perf_counter() - t0 < 1.0


def test_gemma_27b_attention_scale_follows_its_training_config():
  # transformers' Gemma2Config defaults are gemma-2-9b's; the 27B model has 46 layers, hidden 4608, 32 heads of 128
  # and query_pre_attn_scalar 144 (its published config), which GGUF files don't store
  import transformers
  c9 = transformers.Gemma2Config()
  cfg9 = Config("gemma2", c9.hidden_size, c9.num_hidden_layers, c9.num_attention_heads, c9.num_key_value_heads,
                c9.intermediate_size, 512, head_dim=c9.head_dim)
  assert cfg9.scale == pytest.approx(c9.query_pre_attn_scalar ** -0.5)
  cfg27 = Config("gemma2", 4608, 46, 32, 16, 36864, 512, head_dim=128)
  assert cfg27.scale == pytest.approx(144 ** -0.5)
  assert Config("gemma2", 4608, 46, 32, 16, 36864, 512, head_dim=128, attn_scale=0.5).scale == 0.5


# ***** tokenizer metadata that doesn't fit the vocabulary (a short scores list was an IndexError mid-encode) *****
@pytest.mark.parametrize("change, msg", [
  ({"tokenizer.ggml.scores": [0.0, 0.0]}, r"tokenizer.ggml.scores has 2 entries for \d+ tokens"),
  ({"tokenizer.ggml.token_type": [1]}, r"tokenizer.ggml.token_type has 1 entries for \d+ tokens"),
  ({"tokenizer.ggml.eos_token_id": 10**6}, r"tokenizer.ggml.eos_token_id is 1000000; valid: a token id in \[0, "),
  ({"tokenizer.ggml.merges": ["ab"]}, r"tokenizer.ggml.merges\[0\] is 'ab'; valid: two tokens separated by one space"),
  ({"tokenizer.ggml.tokens": []}, r"tokenizer.ggml.tokens is empty"),
])
def test_tokenizer_metadata_is_checked(change, msg):
  toks, scores, types = llm_ref.vocab()
  kv = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
  kv.update(change)
  with pytest.raises(ValueError, match=msg): Tokenizer.from_gguf(kv)


def test_a_vocabulary_shorter_than_the_embedding_is_refused(tmp_path):
  # the model could pick an id past the token list: an error at load, not at the first such token in generation
  llm_ref.make_model(str(tmp_path / "m.gguf"), n_layers=1)
  kv, ts = read_gguf(str(tmp_path / "m.gguf"))
  n = len(kv["tokenizer.ggml.tokens"])
  kv.update({k: kv[k][:n - 5] for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")})
  kv["llama.vocab_size"] = n   # the embedding's rows (without it the vocabulary is the token list's length)
  write_gguf(str(tmp_path / "short.gguf"), kv, {k: t.numpy() for k, t in ts.items()})
  with pytest.raises(ValueError, match=f"the model has {n} token embeddings but tokenizer.ggml.tokens lists only "
                                       f"{n - 5} tokens"):
    LLM.load(str(tmp_path / "short.gguf"))


# ***** prefill in jitted chunks (issue #39) *****
def test_chunked_prefill_matches_reference_and_decode_and_captures_once(tmp_path):
  """The prompt runs through one TinyJit-ed chunk of 8 tokens at a symbolic start (the last chunk padded): its
  logits equal the independent numpy forward pass and the token-by-token decode steps', for lengths that are not a
  multiple of the chunk, at a later start (a cached prefix) and where the padded chunk would overrun the context
  (then one unjitted pass). One capture serves every chunk: later prompts compile nothing."""
  path = str(tmp_path / "c.gguf")
  ws = llm_ref.make_model(path, n_layers=2, seed=7, ctx=48)
  kv, ts = read_gguf(path)
  m = Transformer(Config.from_gguf(kv), ts, prefill_chunk=8)
  rng = np.random.default_rng(0)
  programs, capture = [], None
  for n in (5, 13, 19, 11, 21):
    prompt = [int(t) for t in rng.integers(3, 300, n)]
    ref = llm_ref.forward(ws, prompt)
    np.testing.assert_allclose(m.prefill(prompt).numpy(), ref[-1], rtol=1e-4, atol=1e-4)
    # token by token: the first through prefill, the rest through the jitted decode step
    m.prefill(prompt[:1])
    for i in range(1, n): lg = m.decode(prompt[i], i)
    np.testing.assert_allclose(lg.numpy(), ref[-1], rtol=1e-4, atol=1e-4)
    # a continuation after a cached prefix: chunks at start 3
    np.testing.assert_allclose(m.prefill(prompt[3:], 3).numpy(), ref[-1], rtol=1e-4, atol=1e-4)
    programs.append(len(engine._program_cache))
    capture = capture or m.chunk_step.captured
    assert m.chunk_step.captured is capture
  assert capture is not None and len(set(programs[1:])) == 1, programs
  # the attention probabilities of a chunk are a buffer: no kernel that reads the value cache computes exp (fused,
  # every exp was recomputed for each of the head_dim outputs, 11-14 ms of a 1-layer 32-token chunk's ~38)
  from tiny_uop.uop import Ops
  vcache = {id(engine.get_buffer(engine.buffer_view(lay.cache_v.uop)[0])) for lay in m.layers}
  readers = [c for c in capture.calls if any(id(r) in vcache for r in getattr(c, "refs", []))]
  assert readers and not [c.name for c in readers if any(u.op is Ops.EXP2 for u in _kernel_ast(c).toposort())]
  # 44 + 8 > 48: the last chunk can't be padded inside the context, so it runs unjitted
  prompt = [int(t) for t in rng.integers(3, 300, 46)]
  np.testing.assert_allclose(m.prefill(prompt).numpy(), llm_ref.forward(ws, prompt)[-1], rtol=1e-4, atol=1e-4)
  for bad in (0, 49, True, 2.0):
    with pytest.raises(ValueError, match="prefill_chunk"): Transformer(Config.from_gguf(kv), ts, prefill_chunk=bad)
  with pytest.raises(ValueError, match="at least one token"): m.prefill([])
  with pytest.raises(ValueError, match="start_pos"): m.prefill([5], -1)


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_k_quant_matvec_reduces_over_groups_of_64(t):
  """A one-token matvec over Q4_K/Q6_K blocks reduces over (K/64 groups) x 64 in one kernel: the inner loop covers
  two 32-element sub-blocks and the scale/min decoding of the super-block sits outside it (with one flat K loop it
  was redone every 16 lanes: Q4_K ran 2x slower). Values against the gguf package's dequantization, for one token
  and for several (the prefill's matmul, which keeps the flat reduction)."""
  import gguf
  from tiny_uop.uop import Ops
  from tiny_codegen.opt.kernel import _bound
  from tiny_tensor.llm.model import QLinear
  from tiny_tensor.jit import TinyJit
  rng = np.random.default_rng(6)
  w = rng.standard_normal((64, 512), dtype=np.float32)
  raw = np.frombuffer(quantize(w, t), np.uint8)
  ref_w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(w.shape)
  lin = QLinear(Tensor(raw.reshape(-1, BLOCK[t][1])).realize(), t, w.shape)
  step = TinyJit(lambda v: lin(v).realize())
  for _ in range(3):
    x = rng.standard_normal((1, 1, 512), dtype=np.float32)
    np.testing.assert_allclose(step(Tensor(x)).numpy().reshape(-1), ref_w @ x.reshape(-1), rtol=1e-5, atol=1e-4)
  (call,) = step.captured.calls
  reduce_sizes = sorted(_bound(r) for u in _kernel_ast(call).toposort() if u.op is Ops.REDUCE
                        for r in u.src[1:] if r.op is Ops.RANGE)
  assert reduce_sizes == [8, 64], reduce_sizes
  # the inner 64 is unrolled 16 (one byte vector) although the kernel is small (64 x 512: the unroll budget of the
  # byte lanes is per vector): with 8 or 4 lanes a 768x768 Q4_K matvec ran scalar, 5.6x slower
  from tiny_codegen.opt import optimize_kernel
  from tiny_uop.plugins import Device
  ren = Device[call.device].renderer
  if ren.vectorize_upcast:
    opts = optimize_kernel(_kernel_ast(call), ren).arg.applied_opts
    assert any(o.op.name == "UNROLL" and o.arg == 16 for o in opts), opts
  xs = rng.standard_normal((1, 5, 512), dtype=np.float32)
  np.testing.assert_allclose(lin(Tensor(xs)).numpy(), xs @ ref_w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q4_K], ids=lambda t: t.name)
def test_quantized_weight_is_decoded_once_per_prefill_chunk(t):
  """With several tokens (a prefill chunk) the blocks are decoded once into a float32 buffer (O x K) that the matmul
  reads: fused into the matmul, every block was decoded again for every token (a 1-layer Q4_K chunk of 32 tokens
  spent ~760 ms in its matmuls, ~76 ms after). Values against the gguf package's dequantization."""
  import gguf
  from tiny_tensor.llm.model import QLinear
  from tiny_tensor.jit import TinyJit
  rng = np.random.default_rng(8)
  w = rng.standard_normal((48, 512), dtype=np.float32)
  raw = np.frombuffer(quantize(w, t), np.uint8)
  ref_w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).reshape(w.shape)
  packed = Tensor(raw.reshape(-1, BLOCK[t][1])).realize()
  lin = QLinear(packed, t, w.shape)
  step = TinyJit(lambda v: lin(v).realize())
  for _ in range(3):
    x = rng.standard_normal((1, 7, 512), dtype=np.float32)
    np.testing.assert_allclose(step(Tensor(x)).numpy(), x @ ref_w.T, rtol=1e-5, atol=1e-4)
  raw_buf = engine.get_buffer(engine.buffer_view(packed.uop)[0])
  readers = [c for c in step.captured.calls if any(r is raw_buf for r in getattr(c, "refs", []))]
  assert len(readers) == 1 and len(step.captured.calls) == 2, [c.name for c in step.captured.calls]
  assert readers[0].refs[0].nbytes == 4 * w.size  # the decoded weight: float32, written once


def _gguf_package_weights(ts) -> dict[str, np.ndarray]:
  """A file's tensors as float32, decoded by the `gguf` package (an independent codec)."""
  import gguf
  def decode(v):
    return gguf.quants.dequantize(np.ascontiguousarray(v.raw), gguf.GGMLQuantizationType(int(v.ggml_type)))
  return {k: np.asarray(decode(v), np.float32).reshape(v.shape) for k, v in ts.items()}


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("budget", [None, 0], ids=["kept", "no-memory"])
def test_prefill_chunks_multiply_weights_decoded_once_per_model(tmp_path, monkeypatch, t, budget):
  """The first multi-token prefill decodes every quantized layer weight once into a float32 copy laid out as the
  chunk's matmul reads it (`DenseWeight`): the jitted chunk then reads no quantized block (it decoded every weight
  again and packed it into panels, chunk after chunk: 60% of a 4-layer Q4_K chunk's kernel time, issue #39). Where
  the copies don't fit `dense_budget` the chunks decode per call, as before. Logits against a numpy forward pass over
  the `gguf` package's decoding of the file."""
  from tiny_tensor.llm import model as llm_model
  if budget is not None: monkeypatch.setattr(llm_model, "dense_budget", lambda device: budget)
  # float32 activations and prefill products (a VNNI CPU's int8 activations and AMX's bfloat16 products move the
  # logits past 1e-4): set here, not left to the module-scoped `mixed` fixture, which only the full module sets up
  monkeypatch.setattr(llm_model, "int8_dot_products", lambda device: False)
  monkeypatch.setattr(llm_model, "PREFILL_AMX", False)
  path = str(tmp_path / "d.gguf")
  llm_ref.make_model(path, n_layers=2, dim=256, hidden=512, n_heads=4, n_kv=2, wtype=t, seed=11, ctx=64)
  kv, ts = read_gguf(path)
  ws = _gguf_package_weights(ts)
  m = Transformer(Config.from_gguf(kv), ts, prefill_chunk=8)
  rng = np.random.default_rng(2)
  for n in (13, 9, 16):
    prompt = [int(x) for x in rng.integers(3, 300, n)]
    np.testing.assert_allclose(m.prefill(prompt).numpy(), llm_ref.forward(ws, prompt)[-1], rtol=1e-4, atol=1e-4)
  lins = [w for lay in m.layers for w in (lay.wq, lay.wk, lay.wv, lay.wo, lay.w_gate, lay.w_up, lay.w_down)]
  raws = {id(engine.get_buffer(engine.buffer_view(w.raw.uop)[0])) for w in lins}
  reads = [c.name for c in m.chunk_step.captured.calls if any(id(r) in raws for r in getattr(c, "refs", []))]
  if budget == 0: assert len(reads) == len(lins) and all(w.dense is None for w in lins), reads
  else: assert not reads and all(w.dense is not None for w in lins), reads


def test_prefill_chunks_read_float_weights_packed_once(tmp_path, vector_registers):
  """A float weight that a 32-token chunk's matmul packs into column panels (`gemm_panel`, strided B) is packed once,
  at the first prefill (`DenseWeight`); the jitted chunk reads the panels, not the weight (it packed every such weight
  again each chunk: 97 -> 77 kernels a 4-layer F32 chunk of the bench model). Logits against numpy. The register
  file pinned to AVX-512's (which packs a strided B from 32 rows) so every machine runs the packed path."""
  from tiny_tensor.llm.model import _prefill_panel
  vector_registers(32, 64)
  path = str(tmp_path / "f.gguf")
  ws = llm_ref.make_model(path, n_layers=1, dim=768, hidden=2048, n_heads=4, n_kv=2, seed=12, ctx=64)
  kv, ts = read_gguf(path)
  m = Transformer(Config.from_gguf(kv), ts, prefill_chunk=32)
  rng = np.random.default_rng(3)
  for n in (40, 33, 20):
    prompt = [int(x) for x in rng.integers(3, 300, n)]
    np.testing.assert_allclose(m.prefill(prompt).numpy(), llm_ref.forward(ws, prompt)[-1], rtol=1e-4, atol=1e-4)
  lins = [w for lay in m.layers for w in (lay.wq, lay.wk, lay.wv, lay.wo, lay.w_gate, lay.w_up, lay.w_down)]
  packed = [w for w in lins if _prefill_panel(w.w, 32)]
  assert packed and all(w.dense is not None and w.dense.panel for w in packed)
  bufs = {id(engine.get_buffer(engine.buffer_view(w.w.uop)[0])) for w in packed}
  reads = [c.name for c in m.chunk_step.captured.calls if any(id(r) in bufs for r in getattr(c, "refs", []))]
  assert not reads, reads


@pytest.mark.parametrize("chunk", [2, 4])
def test_short_prefill_chunks_read_weights_in_panels(tmp_path, monkeypatch, vector_registers, chunk):
  """A chunk of 2-7 rows reads its float32 weight copies in column panels too (`_prefill_panel`, from
  `PANEL_MIN_ROWS` rows): in place the product read all of W once per row, the panels once per call (2048x768, one
  thread: two rows 577 -> 295 us); the old `rows >= 8` left them in place. The register file pinned to AVX-512's,
  the float32 copies forced (no AMX). Logits against a numpy forward pass over the `gguf` package's decoding."""
  monkeypatch.setattr(model_mod, "PREFILL_AMX", False)
  monkeypatch.setattr(model_mod, "int8_dot_products", lambda device: False)  # float32 activations: 1e-4
  vector_registers(32, 64)
  path = str(tmp_path / "s.gguf")
  llm_ref.make_model(path, n_layers=1, dim=256, hidden=512, n_heads=4, n_kv=2, wtype=GGMLType.Q8_0, seed=13, ctx=64)
  kv, ts = read_gguf(path)
  m = Transformer(Config.from_gguf(kv), ts, prefill_chunk=chunk)
  ws = _gguf_package_weights(ts)
  rng = np.random.default_rng(4)
  for n in (chunk + 1, 2 * chunk):
    prompt = [int(x) for x in rng.integers(3, 300, n)]
    np.testing.assert_allclose(m.prefill(prompt).numpy(), llm_ref.forward(ws, prompt)[-1], rtol=1e-4, atol=1e-4)
  lins = [w for lay in m.layers for w in (lay.wq, lay.wk, lay.wv, lay.wo, lay.w_gate, lay.w_up, lay.w_down)]
  assert all(w.dense is not None and w.dense.panel == 32 for w in lins), [w.dense and w.dense.panel for w in lins]


def test_chunk_attention_product_is_written_in_its_own_layout(tmp_path):
  """A chunk's probs @ vals goes to a (n_kv, rep, t, hd) buffer and the heads' permute to (t, n_heads * hd) is a
  copy: written straight into the permuted layout, its reduce over the cache length ran 231 us a layer (32-token Q4_K
  chunk, one thread) against 15 + 8 us now. The attention's output kernel has no reduce; its numbers against numpy's
  softmax attention over the same q, k, v."""
  path = str(tmp_path / "a.gguf")
  llm_ref.make_model(path, n_layers=1, dim=128, hidden=256, n_heads=4, n_kv=2, wtype=GGMLType.F32, seed=5, ctx=32)
  kv, ts = read_gguf(path)
  m = Transformer(Config.from_gguf(kv), ts)
  t, lay, cfg = 4, m.layers[0], m.cfg
  h = Tensor(np.random.default_rng(1).standard_normal((1, t, cfg.dim)).astype(np.float32))
  rot = tuple(c.shrink(((0, t), None)) for c in m.rot)
  mask, _ = m._masks(t, 0)
  out = lay._attention(h, 0, rot, mask)
  from tiny_tensor.llm.model import rope
  from tiny_uop import Ops
  last = [c.src[0] for c in out.schedule().calls if c.src[0].op is Ops.SINK][-1]
  assert not any(u.op is Ops.REDUCE for u in last.toposort())
  got = out.numpy().reshape(t, cfg.n_heads, cfg.hd)
  q = lay.wq(h).reshape(t, cfg.n_heads, cfg.hd)
  q = rope(q.reshape(1, t, cfg.n_heads, cfg.hd), rot[0], rot[1], lay.spec.neox).numpy().reshape(t, cfg.n_heads, cfg.hd)
  k = lay.cache_k.numpy()[:t]                                                   # written by the call above
  v = lay.cache_v.numpy()[:t]
  rep = cfg.n_heads // cfg.n_kv_heads
  for hh in range(cfg.n_heads):
    s = q[:, hh].astype(np.float64) @ k[:, hh // rep].T.astype(np.float64) * cfg.scale
    s = s + np.triu(np.full((t, t), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got[:, hh], (p / p.sum(-1, keepdims=True)) @ v[:, hh // rep], rtol=1e-4, atol=1e-5)
