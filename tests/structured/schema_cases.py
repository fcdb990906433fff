"""Real-world-shaped JSON schemas with a prompt each, shared by the engine and server tests.

Each case: (name, prompt, schema). The set covers nested objects, arrays with bounds, enums,
numbers with minimum / maximum, required and optional fields, $defs / $ref, anyOf, string
patterns and formats, as the structured-outputs issue asks.
"""

from __future__ import annotations

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 60},
        "city": {"type": "string", "maxLength": 40},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["street", "city", "zip"],
}

SCHEMA_CASES: list[tuple[str, str, dict]] = [
    (
        "person",
        "Describe a person named Alice who is 30 years old.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
            },
            "required": ["name", "age"],
        },
    ),
    (
        "optional_fields",
        "Give a book title and, if you know it, its author.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 80},
                "author": {"type": "string", "maxLength": 60},
                "year": {"type": "integer", "minimum": 1000, "maximum": 2030},
            },
            "required": ["title"],
        },
    ),
    (
        "nested_address",
        "Give the address of a bakery in a small town.",
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 40}, "address": ADDRESS},
            "required": ["name", "address"],
        },
    ),
    (
        "enum_status",
        "What is the status of an order that has shipped?",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "integer", "minimum": 1},
                "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
            },
            "required": ["order_id", "status"],
        },
    ),
    (
        "bounded_array",
        "List three fruits.",
        {
            "type": "object",
            "properties": {
                "fruits": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "minItems": 2,
                    "maxItems": 4,
                }
            },
            "required": ["fruits"],
        },
    ),
    (
        "number_range",
        "Give a temperature in Celsius for a warm day and a humidity fraction.",
        {
            "type": "object",
            "properties": {
                "celsius": {"type": "number", "minimum": -50, "maximum": 60},
                "humidity": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["celsius", "humidity"],
        },
    ),
    (
        "exclusive_bounds",
        "Rate a movie from 1 to 10.",
        {
            "type": "object",
            "properties": {
                "movie": {"type": "string", "maxLength": 50},
                "rating": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 11},
            },
            "required": ["movie", "rating"],
        },
    ),
    (
        "defs_ref",
        "Describe two employees of a company.",
        {
            "$defs": {
                "employee": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 40},
                        "role": {"enum": ["engineer", "manager", "designer"]},
                    },
                    "required": ["name", "role"],
                }
            },
            "type": "object",
            "properties": {
                "company": {"type": "string", "maxLength": 40},
                "employees": {
                    "type": "array",
                    "items": {"$ref": "#/$defs/employee"},
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
            "required": ["company", "employees"],
        },
    ),
    (
        "any_of",
        "Give an identifier for a user, either a number or a username.",
        {
            "type": "object",
            "properties": {
                "id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 20}]}
            },
            "required": ["id"],
        },
    ),
    (
        "pattern_phone",
        "Give a phone number in the format 555-123-4567.",
        {
            "type": "object",
            "properties": {"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{3}-[0-9]{4}$"}},
            "required": ["phone"],
        },
    ),
    (
        "format_email",
        "Give the contact email of a support team.",
        {
            "type": "object",
            "properties": {"email": {"type": "string", "format": "email"}},
            "required": ["email"],
        },
    ),
    (
        "format_date",
        "When is New Year's Day 2025? Give the date.",
        {
            "type": "object",
            "properties": {
                "event": {"type": "string", "maxLength": 40},
                "date": {"type": "string", "format": "date"},
            },
            "required": ["event", "date"],
        },
    ),
    (
        "boolean_flags",
        "Is the sky blue? Is grass red?",
        {
            "type": "object",
            "properties": {"sky_is_blue": {"type": "boolean"}, "grass_is_red": {"type": "boolean"}},
            "required": ["sky_is_blue", "grass_is_red"],
        },
    ),
    (
        "nullable",
        "Give a user's nickname, or null if they have none.",
        {
            "type": "object",
            "properties": {
                "user": {"type": "string", "maxLength": 30},
                "nickname": {"type": ["string", "null"], "maxLength": 30},
            },
            "required": ["user", "nickname"],
        },
    ),
    (
        "array_of_objects",
        "List two products with their prices.",
        {
            "type": "object",
            "properties": {
                "products": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 30},
                            "price": {"type": "number", "minimum": 0},
                        },
                        "required": ["name", "price"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                }
            },
            "required": ["products"],
        },
    ),
    (
        "top_level_array",
        "List some prime numbers.",
        {"type": "array", "items": {"type": "integer", "minimum": 2}, "minItems": 1, "maxItems": 6},
    ),
    (
        "const_field",
        "Describe an API response that succeeded.",
        {
            "type": "object",
            "properties": {
                "version": {"const": "v1"},
                "ok": {"type": "boolean"},
                "message": {"type": "string", "maxLength": 60},
            },
            "required": ["version", "ok"],
        },
    ),
    (
        "string_lengths",
        "Give a short username and a country code.",
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "minLength": 3, "maxLength": 12},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
            },
            "required": ["username", "country"],
        },
    ),
    (
        "deep_nesting",
        "Describe project Apollo, led by Bob (bob@example.com), with a budget of 5000.",
        {
            "type": "object",
            "properties": {
                "project": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 40},
                        "lead": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "maxLength": 40},
                                "contact": {
                                    "type": "object",
                                    "properties": {"email": {"type": "string", "format": "email"}},
                                    "required": ["email"],
                                },
                            },
                            "required": ["name", "contact"],
                        },
                        "budget": {"type": "integer", "minimum": 0, "maximum": 1000000},
                    },
                    "required": ["name", "lead", "budget"],
                }
            },
            "required": ["project"],
        },
    ),
    (
        "enum_integers",
        "Pick a T-shirt size code: 1 small, 2 medium, 3 large.",
        {
            "type": "object",
            "properties": {"size": {"enum": [1, 2, 3]}, "color": {"enum": ["red", "blue"]}},
            "required": ["size", "color"],
        },
    ),
    (
        "any_of_objects",
        "Describe a payment made by card or by bank transfer.",
        {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "minimum": 0},
                "method": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "card_last4": {"type": "string", "pattern": "^[0-9]{4}$"}
                            },
                            "required": ["card_last4"],
                        },
                        {
                            "type": "object",
                            "properties": {"iban": {"type": "string", "maxLength": 34}},
                            "required": ["iban"],
                        },
                    ]
                },
            },
            "required": ["amount", "method"],
        },
    ),
    (
        "root_ref",
        "Describe a folder named docs that holds one file named notes.txt.",
        {
            "$defs": {
                "file": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 20}},
                    "required": ["name"],
                },
                "folder": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 20},
                        "files": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/file"},
                            "maxItems": 3,
                        },
                    },
                    "required": ["name", "files"],
                },
            },
            "$ref": "#/$defs/folder",
        },
    ),
    (
        "uuid_and_time",
        "Log an event with an id and a timestamp.",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "at": {"type": "string", "format": "date-time"},
            },
            "required": ["id", "at"],
        },
    ),
    (
        "tuple_prefix_items",
        "Give a point as [x, y, label].",
        {
            "type": "array",
            "prefixItems": [
                {"type": "number"},
                {"type": "number"},
                {"type": "string", "maxLength": 10},
            ],
            "items": False,
        },
    ),
    (
        "map_of_numbers",
        "Give the population in millions of two cities.",
        {
            "type": "object",
            "additionalProperties": {"type": "number", "minimum": 0},
            "maxProperties": 3,
        },
    ),
    (
        "weather_tool_like",
        "What's the weather like in Paris? Answer as a forecast.",
        {
            "type": "object",
            "properties": {
                "location": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                            "high": {"type": "integer", "minimum": -60, "maximum": 60},
                        },
                        "required": ["day", "high"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
            "required": ["location", "unit", "days"],
        },
    ),
    (
        "unbounded_strings",
        "Write a title and a one-sentence summary of a news story about a local festival.",
        {
            "type": "object",
            "properties": {"title": {"type": "string"}, "summary": {"type": "string"}},
            "required": ["title", "summary"],
        },
    ),
    (
        "one_of_union",
        "Describe a shape: a circle with a radius or a square with a side.",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "circle"},
                        "radius": {"type": "number", "minimum": 0},
                    },
                    "required": ["kind", "radius"],
                },
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "square"},
                        "side": {"type": "number", "minimum": 0},
                    },
                    "required": ["kind", "side"],
                },
            ]
        },
    ),
]
