"""GPT-2 BPE on 1 MB of input (CPU, once in CI): one 1 MB word of one letter, the input that was quadratic (10 s at
8 KB), counted in heap operations; and 1 MB of ordinary text, checked against Hugging Face `tokenizers`."""
from __future__ import annotations

import random

from tiny_tensor.llm import Tokenizer
from tiny_tensor.llm.tokenizer import _bytes_to_unicode, bpe_merge

MB = 1 << 20


def test_one_megabyte_word_takes_linearly_many_heap_operations():
  stats: dict[str, int] = {}
  out = bpe_merge(["a"] * MB, {("a", "a"): 0, ("aa", "aa"): 1}, stats)
  assert out == ["aaaa"] * (MB // 4)
  # n - 1 first candidates, then each merge pushes at most 2; the quadratic algorithm scanned ~n^2/2 pairs
  assert stats["pushes"] <= 2 * MB and stats["pops"] == stats["pushes"], stats


def test_one_megabyte_of_text_matches_tokenizers():
  b2u = _bytes_to_unicode()
  merges = ["Ġ t", "h e", "Ġt he", "a n", "Ġ a", "Ġa n", "Ġan d", "i n", "Ġ in", "o n"]
  vocab = [b2u[b] for b in range(256)] + sorted({m.replace(" ", "") for m in merges})
  tok = Tokenizer("gpt2", vocab, merges=merges, add_bos=False)
  rng = random.Random(0)
  words = ["the", "and", "in", "on", "a", "an", "nation", "then", "hand", "in2", "x!"]
  text = " ".join(rng.choice(words) for _ in range(MB // 4))[:MB]
  ids = tok.encode(text)
  from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
  hf = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=[tuple(m.split()) for m in merges]))
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  assert ids == hf.encode(text).ids
