"""Tokenizers read from GGUF metadata (`tokenizer.ggml.*`): SentencePiece-style (`model = "llama"`: pieces with
scores, '▁' for spaces, <0xXX> byte fallback) and GPT-2-style byte-level BPE (`model = "gpt2"`: ranked merges over
bytes mapped to printable characters).

>>> tok = Tokenizer.from_gguf({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>",
...   "▁", "h", "i", "▁h", "▁hi"], "tokenizer.ggml.scores": [0, 0, 0, -1, -2, -2, -1.5, -0.5],
...   "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1], "tokenizer.ggml.bos_token_id": 1})
>>> tok.encode("hi"), tok.decode(tok.encode("hi"))
([1, 7], 'hi')
"""
from __future__ import annotations

import heapq
import re
from typing import Any

__all__ = ["Tokenizer"]

_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6
_WORD_CACHE = 1 << 16  # words whose BPE ids a tokenizer keeps
# GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols, spaces (\p{L}/\p{N} as [^\W\d_] / \d)
_GPT2_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+|_+""", re.UNICODE)


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character map (bytes that print as themselves keep their character)."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  out, n = {}, 0
  for b in range(256):
    if b in keep: out[b] = chr(b)
    else:
      out[b] = chr(256 + n)
      n += 1
  return out


def bpe_merge(symbols: list[str], ranks: dict[tuple[str, ...], int], stats: dict[str, int] | None = None) -> list[str]:
  """GPT-2 BPE on one word: merge the adjacent pair of lowest rank (the leftmost of equals) until no pair has a rank.

  O(n log n) in the word's length: the symbols form a doubly linked list (merging is O(1)) and the candidate pairs sit
  in a heap keyed by (rank, position of the left symbol); a merge changes only its two neighbouring pairs, so it pushes
  at most two candidates, and a candidate whose symbols changed since it was pushed is dropped when it is popped.
  Positions are indices into `symbols`, which keep their left-to-right order, so ties go to the leftmost pair as in
  the plain algorithm (rescan all pairs, merge the best, repeat). `stats`, when given, counts heap "pushes"/"pops".

  >>> bpe_merge(list("aaab"), {("a", "a"): 0, ("aa", "a"): 1, ("a", "b"): 2})
  ['aaa', 'b']
  """
  n = len(symbols)
  if n < 2: return list(symbols)
  syms = list(symbols)
  nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))  # nxt == n: the end; prv == -1: the start
  # a candidate is one int, rank * n + position (cheaper to compare than tuples: this loop is the tokenizer's hot path)
  get, push, pop = ranks.get, heapq.heappush, heapq.heappop
  heap = [r * n + i for i in range(n - 1) if (r := get((syms[i], syms[i + 1]))) is not None]
  heapq.heapify(heap)
  pushes, pops = len(heap), 0
  while heap:
    rank, i = divmod(pop(heap), n)
    pops += 1
    j = nxt[i]
    # stale: i was merged into its left neighbour (syms[i] == ""), or i or its right neighbour changed since the push
    if not syms[i] or j == n or get((syms[i], syms[j])) != rank: continue
    syms[i] = m = syms[i] + syms[j]
    syms[j] = ""
    k = nxt[i] = nxt[j]
    if k < n:
      prv[k] = i
      if (r := get((m, syms[k]))) is not None:
        push(heap, r * n + i)
        pushes += 1
    if (h := prv[i]) >= 0 and (r := get((syms[h], m))) is not None:
      push(heap, r * n + h)
      pushes += 1
  if stats is not None:
    stats["pushes"] = stats.get("pushes", 0) + pushes
    stats["pops"] = stats.get("pops", 0) + pops
  return [s for s in syms if s]


def _check_vocab(tokens: list, scores: list, types: list, merges: list | None, bos_id: Any, eos_id: Any) -> None:
  """The tokenizer metadata is consistent, else a ValueError naming the GGUF key, what it holds and what is valid:
  one string per token, one score and one type per token, merges of two space-separated parts, special ids inside
  the vocabulary (a short scores list indexed past its end; an eos id past it never stops generation)."""
  if not tokens: raise ValueError("tokenizer.ggml.tokens is empty; a tokenizer needs at least one token")
  if (bad := next((i for i, t in enumerate(tokens) if not isinstance(t, str)), None)) is not None:
    raise ValueError(f"tokenizer.ggml.tokens[{bad}] is {tokens[bad]!r}; every token must be a string")
  for key, vals, kind in (("tokenizer.ggml.scores", scores, (int, float)), ("tokenizer.ggml.token_type", types, int)):
    if len(vals) != len(tokens):
      raise ValueError(f"{key} has {len(vals)} entries for {len(tokens)} tokens; it needs one per token")
    if (bad := next((i for i, v in enumerate(vals) if not isinstance(v, kind) or isinstance(v, bool)), None)) \
        is not None:
      raise ValueError(f"{key}[{bad}] is {vals[bad]!r}; valid: a number per token")
  for i, m in enumerate(merges or []):
    if not isinstance(m, str) or len(m.split(" ")) != 2:
      raise ValueError(f"tokenizer.ggml.merges[{i}] is {m!r}; valid: two tokens separated by one space")
  for key, v in (("tokenizer.ggml.bos_token_id", bos_id), ("tokenizer.ggml.eos_token_id", eos_id)):
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < len(tokens)):
      raise ValueError(f"{key} is {v!r}; valid: a token id in [0, {len(tokens)})")


class Tokenizer:
  """Text <-> token ids with the vocabulary of a GGUF file; `bos_id`/`eos_id` and the special (control and
  user-defined) tokens, which are matched whole in the text before splitting it."""

  def __init__(self, model: str, tokens: list[str], scores: list[float] | None = None,
               types: list[int] | None = None, merges: list[str] | None = None, bos_id: int | None = None,
               eos_id: int | None = None, add_bos: bool = True, add_space_prefix: bool = True):
    if model not in ("llama", "gpt2"):
      raise ValueError(f"tokenizer model {model!r} is not supported; supported: 'llama' (SentencePiece), 'gpt2' (BPE)")
    self.model, self.tokens = model, list(tokens)
    self.scores = list(scores) if scores is not None else [0.0] * len(tokens)
    self.types = list(types) if types is not None else [1] * len(tokens)
    _check_vocab(self.tokens, self.scores, self.types, merges, bos_id, eos_id)
    self.ids = {t: i for i, t in enumerate(self.tokens)}
    self.bos_id, self.eos_id, self.add_bos, self.add_space_prefix = bos_id, eos_id, add_bos, add_space_prefix
    special = (t for t, ty in zip(self.tokens, self.types) if ty in (_CONTROL, _USER_DEFINED) and len(t) > 1)
    self.special = sorted(special, key=len, reverse=True)
    self._special_re = re.compile("(" + "|".join(re.escape(s) for s in self.special) + ")") if self.special else None
    self.ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges or [])}
    self.b2u = _bytes_to_unicode()
    self.u2b = {v: k for k, v in self.b2u.items()}
    self._word_ids: dict[str, list[int]] = {}  # BPE: the ids of words seen before (text repeats its words)
    self.byte_ids = {int(t[3:5], 16): i for i, t in enumerate(self.tokens) if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t)}

  @staticmethod
  def from_gguf(kv: dict[str, Any]) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes."""
    if "tokenizer.ggml.tokens" not in kv: raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
    model = kv.get("tokenizer.ggml.model", "llama")
    return Tokenizer(model, kv["tokenizer.ggml.tokens"], kv.get("tokenizer.ggml.scores"),
                     kv.get("tokenizer.ggml.token_type"), kv.get("tokenizer.ggml.merges"),
                     kv.get("tokenizer.ggml.bos_token_id"), kv.get("tokenizer.ggml.eos_token_id"),
                     bool(kv.get("tokenizer.ggml.add_bos_token", model == "llama")),
                     bool(kv.get("tokenizer.ggml.add_space_prefix", True)))

  @property
  def vocab_size(self) -> int: return len(self.tokens)

  # ***** encoding *****
  def encode(self, text: str, bos: bool | None = None) -> list[int]:
    """Token ids of `text` (a BOS id first when the model adds one and `bos` is not False)."""
    out = [self.bos_id] if (self.add_bos if bos is None else bos) and self.bos_id is not None else []
    parts = self._special_re.split(text) if self._special_re else [text]
    first = True
    for p in parts:
      if not p: continue
      if p in self.ids and p in self.special: out.append(self.ids[p])
      else: out += self._encode_spm(p, first) if self.model == "llama" else self._encode_bpe(p)
      first = False
    return out

  def _encode_spm(self, text: str, first: bool) -> list[int]:
    """SentencePiece BPE: start from characters, merge the adjacent pair whose merge is the best-scoring piece."""
    s = ("▁" if self.add_space_prefix and first and not text.startswith(" ") else "") + text.replace(" ", "▁")
    syms = list(s)
    heap: list[tuple[float, int, int, str]] = []
    def push(i: int, j: int) -> None:
      m = syms[i] + syms[j]
      if m in self.ids: heapq.heappush(heap, (-self.scores[self.ids[m]], i, j, m))
    nxt, prv = list(range(1, len(syms) + 1)), list(range(-1, len(syms) - 1))
    for i in range(len(syms) - 1): push(i, i + 1)
    while heap:
      _, i, j, m = heapq.heappop(heap)
      if not syms[i] or not syms[j] or nxt[i] != j or syms[i] + syms[j] != m: continue  # stale
      syms[i], syms[j] = m, ""
      nxt[i] = nxt[j]
      if nxt[j] < len(syms): prv[nxt[j]] = i
      if prv[i] >= 0: push(prv[i], i)
      if nxt[i] < len(syms): push(i, nxt[i])
    out: list[int] = []
    for piece in syms:
      if not piece: continue
      if piece in self.ids: out.append(self.ids[piece])
      else:  # byte fallback, else the unknown token
        for b in piece.encode("utf-8"):
          out.append(self.byte_ids.get(b, self.ids.get("<unk>", 0)))
    return out

  def _bpe(self, word: str) -> list[str]:
    return bpe_merge(list(word), self.ranks)

  def _encode_bpe(self, text: str) -> list[int]:
    out: list[int] = []
    cache = self._word_ids
    for word in _GPT2_SPLIT.findall(text):
      if (ids := cache.get(word)) is None:
        mapped = "".join(self.b2u[b] for b in word.encode("utf-8"))
        ids = []
        for piece in self._bpe(mapped):
          if piece in self.ids: ids.append(self.ids[piece])
          else: ids += [self.ids[c] for c in piece if c in self.ids]
        if len(cache) >= _WORD_CACHE: cache.clear()  # bounded: a hostile text of distinct words can't grow it
        if len(word) <= 64: cache[word] = ids
      out += ids
    return out

  # ***** decoding *****
  def decode(self, ids: list[int], skip_special: bool = True, strip_space: bool = True) -> str:
    """The text of token ids (special tokens dropped unless `skip_special` is False; the space SentencePiece puts
    before the first word removed unless `strip_space` is False)."""
    return self.decode_bytes(ids, skip_special, strip_space).decode("utf-8", errors="replace")

  def decode_bytes(self, ids: list[int], skip_special: bool = True, strip_space: bool = True) -> bytes:
    """The bytes of token ids (a streaming caller decodes them once they form whole UTF-8 characters)."""
    buf = bytearray()
    for i in ids:
      if not 0 <= i < len(self.tokens):
        raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.tokens)})")
      t, ty = self.tokens[i], self.types[i]
      if ty == _CONTROL and skip_special: continue
      if self.model == "llama":
        if ty == _BYTE or i in self.byte_ids.values() and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
          buf.append(int(t[3:5], 16))
          continue
        s = t.replace("▁", " ")
        if strip_space and self.add_space_prefix and s.startswith(" ") and not buf: s = s[1:]
        buf += s.encode("utf-8")
      else:
        buf += bytes(self.u2b[c] for c in t if c in self.u2b) if ty not in (_CONTROL, _USER_DEFINED) else t.encode()
    return bytes(buf)

  def piece(self, i: int) -> str:
    """The vocabulary string of token id `i`."""
    return self.tokens[i]
