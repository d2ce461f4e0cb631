"""Compilers: rendered source -> binary bytes.

- `llvm.LLVMCompiler`: LLVM IR -> ELF relocatable object, in-process with llvmlite (no external tools).
- `clang.ClangCompiler`: C -> shared object with clang (or cc/gcc when clang is absent).
"""
