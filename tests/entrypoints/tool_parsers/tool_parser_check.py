"""The contract every tool-call parser keeps, checked on one recorded answer: parsed whole
and streamed at every chunking (down to one character, finer than any tokenizer's pieces),
the same content and the same calls; each streamed call opens with its id and name, and its
argument pieces concatenate to its arguments' JSON."""

from __future__ import annotations

import json

from cadence.entrypoints.tool_parsers import ToolCallDelta, ToolParser, collect, parse_tool_calls

STEPS = (1, 2, 3, 5, 11, 10**6)


def stream(parser: ToolParser, text: str, step: int) -> list:
    pieces = []
    for i in range(0, len(text), step):
        pieces += parser.feed(text[i : i + step])
    return pieces + parser.finish()


def check(
    parser_class: type[ToolParser],
    text: str,
    content: str,
    calls: list[tuple[str, dict]],
    parameters: dict | None = None,
) -> None:
    """`text` reads as `content` (stripped) and `calls` ((name, arguments)), whole and
    streamed."""
    whole_content, whole_calls = parse_tool_calls(parser_class(parameters, incremental=False), text)
    assert whole_content.strip() == content
    assert [(c.name, json.loads(c.arguments)) for c in whole_calls] == calls
    for step in STEPS:
        pieces = stream(parser_class(parameters), text, step)
        assert all(p != "" for p in pieces)
        got_content, got_calls = collect(pieces)
        assert got_content.strip() == content, step
        assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls, step
        firsts = {}
        for p in pieces:
            if isinstance(p, ToolCallDelta) and p.index not in firsts:
                firsts[p.index] = p
                assert p.id and p.name, "a call's first piece carries its id and name"
            elif isinstance(p, ToolCallDelta):
                assert p.id is None and p.name is None
        assert sorted(firsts) == list(range(len(calls)))
        assert len({p.id for p in firsts.values()}) == len(calls)


def check_streams_incrementally(parser_class: type[ToolParser], text: str) -> None:
    """Fed one character at a time, a call's arguments come out in several pieces, the
    first before the call's end has arrived."""
    parser = parser_class()
    arg_pieces = 0
    for ch in text:
        arg_pieces += sum(
            1 for p in parser.feed(ch) if isinstance(p, ToolCallDelta) and p.arguments
        )
    assert arg_pieces > 1
