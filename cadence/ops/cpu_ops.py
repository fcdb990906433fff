"""Fused CPU kernels (cadence/csrc/cpu/), compiled once per machine and cached.

`make setup` builds them (`cpu_ops.main()`); a process that finds no
build compiles them on first use (about a minute on two cores) under
~/.cache/cadence/cpu_ops (CADENCE_CACHE_DIR moves it). Where they cannot be built (no C++
compiler) or CADENCE_CPU_KERNELS=0, `ops()` is None and the layers keep their plain
PyTorch ops: the same results, more dispatches a step.

    add_rms_norm(x, residual | None, weight, eps) -> [norm(x + residual), x + residual]
    rotary_(q, k, cos, sin)                           in place
    silu_and_mul(x) -> silu(x[:, :d]) * x[:, d:]
    paged_attention(out, q, k_cache, v_cache, block_tables, first_row, query_lens,
                    seq_lens, block_size, scale, window (0: none), softcap (0: none))
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent.parent / "csrc" / "cpu"
SOURCES = sorted(SOURCE_DIR.glob("*.cpp"))  # one extension: bindings.cpp + one file a job
# -ffp-contract=off: no fused multiply-adds the unfused PyTorch ops would not do (float32
# results stay those ops' own); -fno-math-errno: libm calls without errno vectorize.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]


def enabled() -> bool:
    return os.environ.get("CADENCE_CPU_KERNELS", "1") != "0"


def _cpu_model() -> str:
    try:  # -march=native: a build is only good for the CPU it was made on
        return next(line for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def build_dir() -> Path:
    """A folder per source text and place, flags, torch version and CPU model: an edit, a
    new torch or another machine sharing the home folder rebuilds. (The place counts: torch
    rebuilds when a build's source paths change, so two checkouts sharing one folder would
    rebuild each other's module on every switch, a minute each.)"""
    text = " ".join(FLAGS) + torch.__version__ + _cpu_model() + str(SOURCE_DIR.resolve())
    code = b"".join(f.read_bytes() for f in sorted(SOURCE_DIR.iterdir()) if f.is_file())
    key = hashlib.sha256(code + text.encode()).hexdigest()[:16]
    root = Path(os.environ.get("CADENCE_CACHE_DIR", Path.home() / ".cache" / "cadence"))
    return root / "cpu_ops" / key


@functools.cache
def ops() -> ModuleType | None:
    """The compiled module, or None (disabled, or the build failed: logged once)."""
    if not enabled():
        return None
    try:
        from torch.utils.cpp_extension import load

        path = build_dir()
        path.mkdir(parents=True, exist_ok=True)
        return load(
            name="cadence_cpu_ops",
            sources=[str(f) for f in SOURCES],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(path),
            verbose=False,
        )
    except Exception as e:  # no compiler, no ninja: the plain PyTorch ops serve
        logger.warning("CPU kernels unavailable, using plain PyTorch ops: %s", e)
        return None


def usable(x: torch.Tensor) -> ModuleType | None:
    """The module when `x` may take the fused CPU kernels (a CPU float tensor), else None."""
    if x.device.type != "cpu" or not x.is_floating_point() or x.dtype.itemsize == 1:
        return None
    return ops()


def main() -> None:
    """`make setup`: compile now, not in the first server's start-up."""
    logging.basicConfig(level=logging.INFO)
    module = ops()
    print(f"cadence CPU kernels: {'built in ' + str(build_dir()) if module else 'not available'}")
