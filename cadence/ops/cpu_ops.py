"""Fused CPU kernels (cadence/csrc/cpu/), compiled once per machine and cached.

`make setup` builds them (`cpu_ops.main()`); a process that finds no
build compiles them on first use (about a minute on two cores) under
~/.cache/cadence/cpu_ops (CADENCE_CACHE_DIR moves it). A finished build is imported as it
is, by any process whatever path it reached Python, torch or the sources by (torch's own
loader would rebuild a module whose build file names other paths); a build runs under a
lock that dies with its holder. Where they cannot be built (no C++
compiler) or CADENCE_CPU_KERNELS=0, `ops()` is None and the layers keep their plain
PyTorch ops: the same results, more dispatches a step.

    add_rms_norm(x, residual | None, weight, eps, gemma=False)
                                                      -> [norm(x + residual), x + residual]
                                                      (gemma: Gemma's norm, scaled by 1 + w)
    rotary_(q, k, cos, sin)                           in place
    silu_and_mul(x) -> silu(x[:, :d]) * x[:, d:]
    paged_attention(out, q, k_cache, v_cache, block_tables, first_row, query_lens,
                    seq_lens, block_size, scale, window (0: none), softcap (0: none))
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import sys
import sysconfig
from collections.abc import Iterator
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
    """A folder per source text, flags, Python ABI, torch version and CPU model: an edit,
    another Python or torch, or another machine sharing the home folder builds anew (and
    never imports a library built for another). Not per place: a finished
    build is imported directly (`_import_built`), so two checkouts of the same sources, or
    one venv reached through two paths (a symlinked `.venv/bin/python` and the `cadence`
    script's own interpreter), share one build instead of rebuilding each other's."""
    abi = sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag
    text = " ".join(FLAGS) + abi + torch.__version__ + _cpu_model()
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
        with build_lock(path):  # (never reads a library another process is still linking)
            if (module := _import_built(path)) is not None:
                return module
            return load(
                name=MODULE,
                sources=[str(f) for f in SOURCES],
                extra_cflags=FLAGS,
                extra_ldflags=["-fopenmp"],
                build_directory=str(path),
                verbose=False,
            )
    except Exception as e:  # no compiler, no ninja: the plain PyTorch ops serve
        logger.warning("CPU kernels unavailable, using plain PyTorch ops: %s", e)
        return None


TORCH_BATON = "lock"  # torch.utils.cpp_extension's build lock, in the build folder
MODULE = "cadence_cpu_ops"


def _import_built(path: Path) -> ModuleType | None:
    """The module a finished build left in `path`, imported as it is; None when there is
    none (or it does not load: a build killed while linking is built again)."""
    library = path / f"{MODULE}.so"
    if not library.exists():
        return None
    try:
        spec = importlib.util.spec_from_file_location(MODULE, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError as e:
        logger.warning("rebuilding the CPU kernels: %s did not load (%s)", library, e)
        return None


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path`/build.flock while torch checks or builds the
    module. The kernel drops a flock when its holder dies; torch's own lock is a file made
    with O_EXCL, which a build killed midway leaves behind, and on which every later start
    would wait forever. Holding ours, no live process of ours is building, so a torch lock
    found then is stale: it is removed."""
    with open(path / "build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # (waits while another process builds)
        try:
            stale = path / TORCH_BATON
            if stale.exists():
                logger.warning("removing %s, left by a build that was killed", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
