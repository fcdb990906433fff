"""Engine flags for every command, generated from the configuration dataclasses.

    add_engine_args(parser)        one flag per field of ModelConfig, CacheConfig,
                                   SchedulerConfig and EngineConfig's own scalars
    engine_kwargs_from_args(args)  the flat keyword arguments that LLM(...) and
                                   EngineConfig.from_kwargs(...) take

Names follow vLLM's where the meaning is the same: a field `max_num_batched_tokens` is the
flag `--max-num-batched-tokens`; a bool field gets `--flag` / `--no-flag`. A flag's help is
the comment next to its field in cadence/config.py, so the dataclass stays the one place to
document and add an option. Values are checked by `EngineConfig.validate()`; callers turn
its ValueError into a usage error (see `check_engine_args`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import re
import types
import typing

from cadence.config import (
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    StructuredOutputsConfig,
    parse_size,
)
from cadence.models.architectures import supported_architectures

_SECTIONS: tuple[tuple[str, type], ...] = (
    ("model", ModelConfig),
    ("cache", CacheConfig),
    ("scheduler", SchedulerConfig),
    ("structured", StructuredOutputsConfig),
    ("parallel", ParallelConfig),
    ("lora", LoRAConfig),
    ("engine", EngineConfig),
)

# Set by the engine at start-up, not by users.
_INTERNAL_FIELDS = {
    ("scheduler", "max_model_len"),
    ("parallel", "distributed_init_port"),
    ("engine", "serving"),
}

# Short spellings users know from vLLM.
_SHORT_FLAGS = {"tensor_parallel_size": "-tp"}


def parse_bytes(text: str) -> int:
    """'2147483648', '2GiB', '512MiB', '1.5G' -> bytes (an argparse `type`)."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# Fields whose values are sizes in bytes.
_FIELD_TYPES: dict[str, typing.Callable[[str], object]] = {"kv_cache_memory": parse_bytes}


@functools.cache
def _field_comments(cls: type) -> dict[str, str]:
    """field name -> the `# comment` after it in the class body (the flag's help), also
    where a long one made the formatter wrap the default: `name: T = (` then `value  # ...`."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    wrapped = None  # a field whose default opened a parenthesis on its own line
    for line in source.splitlines():
        m = re.match(r"\s+(\w+)\s*:[^#]*#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
        elif wrapped and (c := re.match(r"[^#]*#\s*(.+)$", line)):
            out[wrapped] = c.group(1).strip()
        opened = re.match(r"\s+(\w+)\s*:[^#=]*=\s*\($", line)
        wrapped = opened.group(1) if opened else None
    return out


def _base_type(annotation) -> tuple[type, bool]:
    """(the non-None type, whether None is allowed) of a field annotation."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"cannot make a flag for a field of type {annotation}")
        return args[0], True
    return annotation, False


def _engine_fields() -> list[tuple[str, dataclasses.Field, type, bool, str]]:
    """(section, field, type, optional, help) for every field that becomes a flag."""
    out = []
    seen: set[str] = set()
    for section, cls in _SECTIONS:
        hints = typing.get_type_hints(cls)
        comments = _field_comments(cls)
        for f in dataclasses.fields(cls):
            if f.name in seen or (section, f.name) in _INTERNAL_FIELDS:
                continue
            if dataclasses.is_dataclass(hints[f.name]):
                continue  # a nested section: its fields are listed on their own
            typ, optional = _base_type(hints[f.name])
            if typ not in (bool, int, float, str):
                continue
            seen.add(f.name)
            out.append((section, f, typ, optional, comments.get(f.name, "")))
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_engine_args(parser: argparse.ArgumentParser, positional_model: bool = True) -> None:
    """Add one flag per engine configuration field to `parser`, in groups per section.

    With `positional_model`, the model may also be given as the first positional argument
    (`cadence bench throughput PATH`), like `vllm serve PATH`.
    """
    groups = {
        "model": parser.add_argument_group(
            "model", "architectures: " + ", ".join(supported_architectures())
        ),
        "cache": parser.add_argument_group("KV cache"),
        "scheduler": parser.add_argument_group("scheduler"),
        "structured": parser.add_argument_group("structured outputs"),
        "parallel": parser.add_argument_group("parallelism"),
        "lora": parser.add_argument_group("LoRA adapters"),
        "engine": parser.add_argument_group("engine"),
    }
    if positional_model:
        groups["model"].add_argument(
            "model_positional",
            nargs="?",
            default=None,
            metavar="MODEL",
            help="same as --model",
        )
    groups["engine"].add_argument(
        "--speculative-config",
        dest="speculative_config",
        default=None,
        metavar="JSON",
        help='speculative decoding, as a JSON object: {"method": "ngram" | "draft_model" | '
        '"eagle3", "num_speculative_tokens": K, "model": PATH (draft_model, eagle3), '
        '"prompt_lookup_min": N, "prompt_lookup_max": N (ngram), "disable_by_batch_size": N} '
        "(default: off)",
    )
    for section, f, typ, _optional, help_text in _engine_fields():
        flags = ["--" + f.name.replace("_", "-")]
        if f.name in _SHORT_FLAGS:
            flags.insert(0, _SHORT_FLAGS[f.name])
        default = _default(f)
        help_text = help_text or f.name.replace("_", " ")
        if typ is bool:
            groups[section].add_argument(
                *flags,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{help_text} (default: {'auto' if default is None else 'on' if default else 'off'})",
            )
            continue
        convert = _FIELD_TYPES.get(f.name, typ)
        shown = "none" if default is None else default
        groups[section].add_argument(
            *flags,
            dest=f.name,
            type=convert,
            default=default,
            metavar=f.name.upper(),
            help=f"{help_text} (default: {shown})",
        )


def engine_kwargs_from_args(args: argparse.Namespace) -> dict:
    """The flat engine keyword arguments held in `args` (for `LLM(**kwargs)`).

    Only values that differ from the dataclass defaults are returned, so a caller's own
    defaults (say, LLM(model=...)) are not overridden by flags the user never gave.
    """
    kwargs = {}
    for _section, f, _typ, _optional, _help in _engine_fields():
        if not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        if value != _default(f):
            kwargs[f.name] = value
    if getattr(args, "speculative_config", None) is not None:
        kwargs["speculative_config"] = args.speculative_config
    positional = getattr(args, "model_positional", None)
    if positional is not None:
        if kwargs.get("model") not in (None, positional):
            raise ValueError(
                f"the model is given twice: {positional!r} and --model {kwargs['model']!r}"
            )
        kwargs["model"] = positional
    return kwargs


def check_engine_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """engine_kwargs_from_args, with any bad value reported as a usage error (exit 2)."""
    try:
        kwargs = engine_kwargs_from_args(args)
        EngineConfig.from_kwargs(**kwargs)
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    return kwargs


def positive_int(text: str) -> int:
    """An argparse `type`: an integer >= 1."""
    return _number(text, int, lambda v: v >= 1, "positive")


def non_negative_int(text: str) -> int:
    """An argparse `type`: an integer >= 0."""
    return _number(text, int, lambda v: v >= 0, "non-negative")


def positive_float(text: str) -> float:
    """An argparse `type`: a number > 0."""
    return _number(text, float, lambda v: v > 0, "positive")


def non_negative_float(text: str) -> float:
    """An argparse `type`: a number >= 0."""
    return _number(text, float, lambda v: v >= 0, "non-negative")


def _number(text: str, kind: type, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value
