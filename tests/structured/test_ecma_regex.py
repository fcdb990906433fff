"""JSON schema's ECMA-262 patterns in Python's `regex`: surrogate pairs become code points."""

from cadence.structured.ecma_regex import compile_pattern, to_python


def test_surrogate_pairs_become_the_code_point_they_spell():
    assert to_python("\\uD83D\\uDE00") == "\\U0001f600"
    any_char = compile_pattern("^[\\u0020-\\uD7FF\\uE000-\\uFFFD\\uD800\\uDC00-\\uDBFF\\uDFFF]*$")
    assert any_char.match("plain text, ü, 😀") and not any_char.match("\x01")


def test_unicode_classes_and_lookaround_are_read():
    assert compile_pattern("^\\p{L}+$").match("héllo")
    assert not compile_pattern("^(?!x)").match("xy")
