"""The docstring examples of the LLM, model and ONNX modules run and give what they show (tiny_tensor.llm's need a
model file: test_llm.py runs the same calls on one it writes)."""
import doctest

import pytest

import tiny_tensor.llm.gguf
import tiny_tensor.llm.quants
import tiny_tensor.llm.tokenizer
import tiny_tensor.models
import tiny_tensor.nn.onnx


@pytest.mark.parametrize("mod", [tiny_tensor.llm.gguf, tiny_tensor.llm.quants, tiny_tensor.llm.tokenizer,
                                 tiny_tensor.models, tiny_tensor.nn.onnx], ids=lambda m: m.__name__)
def test_docstring_examples(mod):
  res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
  assert res.failed == 0, f"{mod.__name__}: {res.failed} of {res.attempted} examples failed"
  assert res.attempted >= 1
