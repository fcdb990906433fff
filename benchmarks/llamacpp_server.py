"""llama-cpp-python's server for the CPU comparison (benchmarks/cpu_vllm_client.sh), taking
the same arguments as `python -m llama_cpp.server`.

Two changes from its defaults:
- its request-id middleware answers 400 (with an empty body) to any `x-request-id` header
  that is not a UUID, and `vllm bench serve` sends one ("bench-<hex>-<n>") with every
  request, so every request failed: here the middleware keeps the header unvalidated;
- `interrupt_requests` defaults to True, which cuts a running completion short whenever
  another request arrives (at concurrency 4, 16 requests returned 139 of 2,048 tokens):
  here it is False unless given, so requests queue and each is served whole.
The server handles one request at a time either way.
"""

from __future__ import annotations

import functools
import runpy
import sys

from starlette_context.plugins import RequestIdPlugin

RequestIdPlugin.__init__ = functools.partialmethod(RequestIdPlugin.__init__, validate=False)
if "--interrupt_requests" not in sys.argv:
    sys.argv += ["--interrupt_requests", "False"]
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
