"""Real schemas that xgrammar compiles slowly (measured against SmolLM2's vocabulary on the
2-core development machine; both release the GIL while they compile):

    HOSTNAME_LIKE   a dotted name of up to 10 labels of up to 100 characters: 1.6 s
                    (up to 20 labels: 3.1 s; up to 50: 7.8 s)
    NESTED_ANYOF    7 levels of "object or array of the level below": 1.3 s
                    (8 levels: 9.7 s, and 0.36 s just to parse; 10 levels: 5 s to parse)

For tests of the compile time bound: with a bound of 0.5 s or less, each is reliably late,
while the schemas of schema_cases.py compile in milliseconds.
"""

from __future__ import annotations

HOSTNAME_LIKE = {"type": "string", "pattern": "^([a-z0-9]{1,100}\\.){1,10}$"}


def nested_any_of(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {
            "anyOf": [
                {"type": "object", "properties": {"a": schema, "b": schema}},
                {"type": "array", "items": schema},
            ]
        }
    return schema


NESTED_ANYOF = nested_any_of(7)
