"""GPT-2 BPE merging (`tiny_tensor.llm.tokenizer.bpe_merge`): the same tokens as Hugging Face `tokenizers`' BPE and as
the plain quadratic algorithm (kept here as the reference), in O(n log n): heap operations counted, not timed."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from tiny_tensor.llm import Tokenizer
from tiny_tensor.llm.tokenizer import _bytes_to_unicode, bpe_merge


def quadratic_bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
  """The textbook algorithm: rescan every adjacent pair, merge the lowest-ranked (leftmost of equals), repeat."""
  parts = list(word)
  while len(parts) > 1:
    rank, i = min((ranks.get((a, b), float("inf")), i) for i, (a, b) in enumerate(zip(parts, parts[1:])))
    if rank == float("inf"): break
    parts[i:i + 2] = [parts[i] + parts[i + 1]]
  return parts


def random_merges(rng: random.Random, alphabet: str, n: int) -> list[tuple[str, str]]:
  """`n` merges as BPE training makes them: each joins two tokens that exist already (letters or earlier merges)."""
  tokens, merges, seen = list(alphabet), [], set()
  while len(merges) < n:
    a, b = rng.choice(tokens), rng.choice(tokens)
    if (a, b) in seen or len(a + b) > 6: continue
    seen.add((a, b))
    merges.append((a, b))
    if a + b not in tokens: tokens.append(a + b)
  return merges


@pytest.mark.parametrize("seed", range(6))
def test_bpe_merge_matches_quadratic_reference_and_tokenizers(seed):
  rng = random.Random(seed)
  alphabet = "abcd"[:2 + seed % 3]
  merges = random_merges(rng, alphabet, 12 + seed * 3)
  ranks = {m: r for r, m in enumerate(merges)}
  words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(150)]
  words += [alphabet[0] * k for k in range(1, 33)]  # runs: the case where ties between equal pairs decide
  vocab: dict[str, int] = {}
  for t in list(alphabet) + ["".join(m) for m in merges]: vocab.setdefault(t, len(vocab))
  ref = HFTokenizer(BPE(vocab=vocab, merges=merges))
  for w in words:
    got = bpe_merge(list(w), ranks)
    assert got == quadratic_bpe(w, ranks), w
    assert got == ref.encode(w).tokens, w


def test_gpt2_tokenizer_encodes_as_before():
  b2u = _bytes_to_unicode()
  merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"]
  vocab = [b2u[b] for b in range(256)] + ["he", "ll", "hell", "hello", "Ġw", "Ġwo"]
  tok = Tokenizer("gpt2", vocab, merges=merges, add_bos=False)
  assert [tok.piece(i) for i in tok.encode("hello world hell")] == ["hello", "Ġwo", "r", "l", "d", "Ġ", "hell"]


def heap_ops(n: int, merges: list[tuple[str, str]]) -> int:
  stats: dict[str, int] = {}
  out = bpe_merge(["a"] * n, {m: r for r, m in enumerate(merges)}, stats)
  assert "".join(out) == "a" * n
  return stats["pushes"] + stats["pops"]


def test_bpe_merge_is_n_log_n_not_quadratic():
  # the input that was quadratic: one long run with merges "a a", "aa aa" (10 s at 8k characters before)
  merges = [("a", "a"), ("aa", "aa"), ("aaaa", "aaaa")]
  ops = {n: heap_ops(n, merges) for n in (1000, 2000, 4000, 8000, 64000)}
  for n in ops: assert ops[n] <= 6 * n, ops  # linear in heap operations (each O(log n)); quadratic is ~n^2 / 2
  assert ops[64000] / ops[8000] < 8 * 1.1, ops
  out = bpe_merge(["a"] * 8003, {m: r for r, m in enumerate(merges)})
  assert out == ["aaaaaaaa"] * 1000 + ["aa", "a"]


def test_tokenizer_docstring_examples():
  import doctest

  import tiny_tensor.llm.tokenizer
  res = doctest.testmod(tiny_tensor.llm.tokenizer)
  assert res.failed == 0 and res.attempted >= 3
