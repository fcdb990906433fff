"""Which Triton kernel variants a process launches, under Triton's interpreter.

Compiled Triton builds one binary per variant of a kernel: its constexpr values, its
launch options (num_warps, num_stages, ...) and the specialisation of its other arguments
(a tensor's dtype and whether its address is 16-byte aligned; an integer's width and, unless
the kernel lists it in `do_not_specialize`, whether it equals 1 or is a multiple of 16).
The interpreter compiles nothing, so `SpecRecorder` computes that key itself for every
launch: a launch with a key not seen before is a launch that would compile on a GPU.
"""

from __future__ import annotations

import inspect

import torch


def _arg_spec(value, specialize: bool):
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        width = "i32" if -(2**31) <= value < 2**31 else "i64"
        if not specialize:
            return width
        return (width, "1" if value == 1 else "16" if value % 16 == 0 else "")
    if isinstance(value, float):
        return "fp32"
    return repr(value)


def spec_key(fn, args: tuple, kwargs: dict) -> tuple:
    """(kernel name, each argument's specialisation or constexpr value, launch options)."""
    params = inspect.signature(fn.fn).parameters
    names = list(params)
    dns = fn.kwargs.get("do_not_specialize") or ()
    dns = {names[d] if isinstance(d, int) else d for d in dns}
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in params})
    key: list = [fn.fn.__name__]
    for name in names:
        value = bound.get(name, params[name].default)
        if "constexpr" in str(params[name].annotation):
            key.append((name, value))
        else:
            key.append((name, _arg_spec(value, name not in dns)))
    key.append(tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in params)))
    return tuple(key)


class SpecRecorder:
    """Records the key of every interpreted kernel launch from `install()` on."""

    def __init__(self) -> None:
        self.keys: set[tuple] = set()
        self.launches: dict[str, int] = {}  # kernel name -> launches

    def install(self, execute: bool = True) -> SpecRecorder:
        """Patch the interpreter. With `execute=False` a launch is recorded and not run: the
        keys depend only on the launch's arguments (dtypes, alignment, sizes, constexprs),
        never on what earlier kernels computed, so a test about variants can skip the
        interpreter's slow arithmetic."""
        from triton.runtime.interpreter import InterpretedFunction

        original = InterpretedFunction.run
        recorder = self

        def run(fn, *args, grid, warmup, **kwargs):
            recorder.keys.add(spec_key(fn, args, kwargs))
            name = fn.fn.__name__
            recorder.launches[name] = recorder.launches.get(name, 0) + 1
            if execute:
                return original(fn, *args, grid=grid, warmup=warmup, **kwargs)
            return None

        InterpretedFunction.run = run
        return self
