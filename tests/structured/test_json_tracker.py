"""The JSON tracker behind run-time schema checks: each value reported as it completes,
with its place, whatever the chunking; clones that leave the original untouched."""

from __future__ import annotations

import pytest

from cadence.structured.json_tracker import JsonTracker

DOC = '{"tags": ["a", "b\\"q"], "n": -1.5e2, "ok": true, "x": {"y": null}, "e": []}'
EVENTS = [
    (("tags", 0), "a", []),
    (("tags", 1), 'b"q', ["a"]),
    (("tags",), ["a", 'b"q'], None),
    (("n",), -150.0, None),
    (("ok",), True, None),
    (("x", "y"), None, None),
    (("x",), {"y": None}, None),
    (("e",), [], None),
    ((), {"tags": ["a", 'b"q'], "n": -150.0, "ok": True, "x": {"y": None}, "e": []}, None),
]


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_values_complete_in_order_whatever_the_chunking(step):
    tracker, events = JsonTracker(), []
    for i in range(0, len(DOC), step):
        events += tracker.feed(DOC[i : i + step])
    assert events == EVENTS and tracker.done


def test_a_number_at_the_end_completes_when_the_text_ends():
    tracker = JsonTracker()
    assert tracker.feed("[1, 23") == [((0,), 1, [])]
    assert tracker.in_bare_scalar and tracker.end() == [((1,), 23, [1])]


def test_a_clone_tries_text_without_touching_the_original():
    tracker = JsonTracker()
    tracker.feed('{"a": [1, 2')
    trial = tracker.clone()
    assert trial.feed("]}")[-1] == ((), {"a": [1, 2]}, None)
    assert tracker.stack[-1].value == [1] and tracker.scalar == "2"
    assert tracker.feed(", 3]}")[-1] == ((), {"a": [1, 2, 3]}, None)
