"""For each schema of schema_cases.py, one instance that satisfies it and one that breaks
it (the smallest change that does), so grammar tests check what is accepted and rejected."""

from __future__ import annotations

UUID = "123e4567-e89b-12d3-a456-426614174000"

# name -> (valid instance, violating instance)
INSTANCES: dict[str, tuple[object, object]] = {
    "person": ({"name": "Alice", "age": 30}, {"name": "Alice", "age": 151}),
    "optional_fields": ({"title": "Dune"}, {"title": "Dune", "year": 999}),
    "nested_address": (
        {"name": "B", "address": {"street": "Main St 1", "city": "Ely", "zip": "12345"}},
        {"name": "B", "address": {"street": "Main St 1", "city": "Ely", "zip": "1234"}},
    ),
    "enum_status": ({"order_id": 7, "status": "shipped"}, {"order_id": 7, "status": "lost"}),
    "bounded_array": ({"fruits": ["apple", "pear"]}, {"fruits": ["apple"]}),
    "number_range": ({"celsius": 21.5, "humidity": 0.4}, {"celsius": 21.5, "humidity": 1.5}),
    "exclusive_bounds": ({"movie": "Up", "rating": 10}, {"movie": "Up", "rating": 11}),
    "defs_ref": (
        {"company": "Acme", "employees": [{"name": "Bo", "role": "engineer"}]},
        {"company": "Acme", "employees": [{"name": "Bo", "role": "intern"}]},
    ),
    "any_of": ({"id": "abc"}, {"id": True}),
    "pattern_phone": ({"phone": "555-123-4567"}, {"phone": "5551234567"}),
    "format_email": ({"email": "ann@example.com"}, {"email": "ann.example.com"}),
    "format_date": ({"event": "Fair", "date": "2026-05-01"}, {"event": "Fair", "date": "May 1"}),
    "boolean_flags": (
        {"sky_is_blue": True, "grass_is_red": False},
        {"sky_is_blue": "yes", "grass_is_red": False},
    ),
    "nullable": ({"user": "ann", "nickname": None}, {"user": "ann"}),
    "array_of_objects": (
        {"products": [{"name": "Tea", "price": 2.5}]},
        {"products": [{"name": "Tea", "price": -1}]},
    ),
    "top_level_array": ([2, 3, 5], [1]),
    "const_field": ({"version": "v1", "ok": True}, {"version": "v2", "ok": True}),
    "string_lengths": ({"username": "ann", "country": "FR"}, {"username": "an", "country": "FR"}),
    "deep_nesting": (
        {
            "project": {
                "name": "P",
                "lead": {"name": "L", "contact": {"email": "l@x.org"}},
                "budget": 5,
            }
        },
        {"project": {"name": "P", "lead": {"name": "L", "contact": {}}, "budget": 5}},
    ),
    "enum_integers": ({"size": 2, "color": "red"}, {"size": 4, "color": "red"}),
    "any_of_objects": (
        {"amount": 10, "method": {"card_last4": "1234"}},
        {"amount": 10, "method": {"card_last4": "12"}},
    ),
    "root_ref": (
        {"name": "docs", "files": [{"name": "a.txt"}]},
        {"name": "docs", "files": [{"title": "a.txt"}]},
    ),
    "uuid_and_time": (
        {"id": UUID, "at": "2026-05-01T10:00:00Z"},
        {"id": "not-a-uuid", "at": "2026-05-01T10:00:00Z"},
    ),
    "tuple_prefix_items": ([1.5, 2, "x"], [1.5, 2, "x", 4]),
    "map_of_numbers": ({"a": 1, "b": 2.5}, {"a": 1, "b": 2, "c": 3, "d": 4}),
    "weather_tool_like": (
        {"location": "Oslo", "unit": "celsius", "days": [{"day": "mon", "high": 3}]},
        {"location": "Oslo", "unit": "kelvin", "days": [{"day": "mon", "high": 3}]},
    ),
    "unbounded_strings": ({"title": "T", "summary": "S"}, {"title": "T"}),
    "one_of_union": ({"kind": "circle", "radius": 1}, {"kind": "circle", "side": 1}),
}
