"""The package's shape, from its source: no import circles between files or packages (every
import counts, TYPE_CHECKING and function-level ones included), and no import that runs
upward (tools/import_graph.py computes the graph)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools/import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def edges(graph):
    return graph.file_edges()


def test_no_file_imports_itself_back_through_others(graph, edges):
    assert graph.circles(edges) == []


def test_no_package_imports_itself_back_through_others(graph, edges):
    assert graph.circles(graph.package_edges(edges)) == []


def test_the_circle_finder_finds_circles(graph):
    assert graph.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_library_code_never_imports_the_command_line(edges):
    upward = [
        (src, dst)
        for src, targets in edges.items()
        for dst in targets
        if dst.startswith("cadence.cli") and not src.startswith("cadence.cli")
    ]
    assert upward == []


@pytest.mark.parametrize(
    "bottom",
    ["cadence.config", "cadence.platform", "cadence.ops", "cadence.sampling_params"],
)
def test_bottom_modules_import_no_higher_layer(edges, bottom):
    allowed = {"cadence.config", "cadence.platform", "cadence.sampling_params"}
    reached = {dst for src, targets in edges.items() if src.startswith(bottom) for dst in targets}
    assert {d for d in reached if not d.startswith(bottom)} <= allowed


def test_no_source_file_is_over_500_lines(graph):
    files, _ = graph.largest(top=1)
    assert files[0][0] <= 500, files
