"""llama-cpp-python's server for the CPU comparison (benchmarks/cpu_vllm_client.sh), taking
the same arguments as `python -m llama_cpp.server`.

One change: its request-id middleware answers 400 (with an empty body) to any
`x-request-id` header that is not a UUID, and `vllm bench serve` sends one
("bench-<hex>-<n>") with every request, so every request failed. Here the middleware keeps
the header without validating it; nothing else about the server differs.
"""

from __future__ import annotations

import functools
import runpy

from starlette_context.plugins import RequestIdPlugin

RequestIdPlugin.__init__ = functools.partialmethod(RequestIdPlugin.__init__, validate=False)
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
