"""One-line errors for tiny's command-line programs (``python -m tiny_uop.plugins``, ``python -m tiny_tensor.llm``,
``python -m tiny_tensor.viz``, ``python -m tiny_tensor.conformance``, ``examples/demo.py``).

A user's mistake or a missing piece of their machine (a device that is not installed or cannot open, a compiler
that is not found) is not a bug in tiny: the program prints one line, ``PROG: error: <what happened and how to fix
it>``, and exits with status 1. The traceback is printed only under ``DEBUG=1`` (or higher), for bug reports.
Every other exception keeps its traceback.

>>> run_main(lambda: 0, "prog")
0
"""
from __future__ import annotations

import sys
from typing import Callable

from tiny_uop.device import CompileError
from tiny_uop.helpers import DEBUG
from tiny_uop.plugins import DeviceUnavailableError, UnknownDeviceError

__all__ = ["USER_ERRORS", "run_main"]

# what these programs report as one line: the message already names the bad value and the fix
USER_ERRORS: tuple[type[BaseException], ...] = (UnknownDeviceError, DeviceUnavailableError, CompileError)


def run_main(main: Callable[[], object], prog: str) -> int:
  """Run a program's `main()` and return its exit status (what it returned when that is an int, else 0); an error
  in `USER_ERRORS` becomes one line on stderr and status 1, with the traceback too when ``DEBUG>=1``."""
  try:
    rc = main()
    return rc if isinstance(rc, int) else 0
  except USER_ERRORS as e:
    if DEBUG.value >= 1: raise
    msg = str(e).strip() or type(e).__name__
    print(f"{prog}: error: {msg} (DEBUG=1 prints the traceback)", file=sys.stderr, flush=True)
    return 1
