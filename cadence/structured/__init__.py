"""Structured outputs: grammars from JSON schemas, regexes, choices and EBNF (xgrammar)."""
