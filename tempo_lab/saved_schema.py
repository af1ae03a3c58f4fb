"""The JSON that ``tl.save`` writes, as JSON Schema (version 1 of each stage's format).

``tl.load`` checks a file against it before building anything, so that a truncated, edited or
hostile file is refused at the field it breaks (``field sdg.ops[4].line is -1: it must be bigger
than or equal to 0``) instead of failing later, when a view prints it. What a schema cannot say
(an edge names an op that exists) ``saved.check_refs`` checks.

The check is ``fastjsonschema``'s (it compiles a schema to Python; nbformat uses it too): 11 ms
for a one-layer decoder's program file, where ``jsonschema`` took 256 ms and, on one edited file,
over 15 minutes to pick the error to report. It stops at the first error; nullable fields are
written as a list of types, not ``anyOf``, so that the error names the innermost field."""
from __future__ import annotations

from functools import cache


def _or_null(schema: dict) -> dict:
    return {**schema, "type": ["null", schema["type"]]}


COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
INT = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
TEXT = {"type": "string"}
NUMBER = {"type": "number"}
TEXTS = {"type": "array", "items": TEXT}
COUNTS = {"type": "array", "items": COUNT}
SIZES = {"type": "array", "items": _or_null(COUNT)}  # None: unbounded


def _object(required: dict, optional: dict | None = None) -> dict:
    """An object with these fields and no others."""
    return {"type": "object", "required": sorted(required),
            "properties": {**required, **(optional or {})}, "additionalProperties": False}


def _mapping(value: dict) -> dict:
    return {"type": "object", "additionalProperties": value}


def _schema(name: str) -> dict:
    return {"type": "string", "pattern": f"^tempo_lab\\.{name}/"}


FRAME = _object({"file": TEXT, "line": COUNT, "function": TEXT})
OP = _object({"id": COUNT, "kind": TEXT, "name": _or_null(TEXT),
              "domain": TEXTS, "shape": TEXTS, "dtype": TEXT, "attrs": _mapping(TEXT), "file": TEXT, "line": COUNT},
             {"category": TEXT, "scope": TEXTS, "stack": {"type": "array", "items": FRAME},
              "call": TEXT})
EDGE = _object({"dst": COUNT, "src": COUNT, "slot": COUNT, "index": TEXTS, "cond": TEXT,
                "file": TEXT, "line": COUNT})
RAGGED = _object({"over": TEXT, "lengths": _or_null(COUNTS)},
                 {"done": _or_null(COUNT), "max": COUNT})
SDG = _object({"schema": _schema("sdg"), "dims": TEXTS, "ops": {"type": "array", "items": OP},
               "edges": {"type": "array", "items": EDGE}, "outputs": _mapping(COUNT)},
              {"sinks": COUNTS, "untils": _mapping(COUNT), "ragged": _mapping(RAGGED),
               "made_dims": _mapping(TEXTS)})
EVENT = _object({"kind": TEXT, "op": _or_null(COUNT),
                 "source": _or_null(COUNT), "note": TEXT})
PASSES = _object({"schema": _schema("passtrace"), "initial": SDG,
                  "passes": {"type": "array", "items": _object(
                      {"name": TEXT, "seconds": NUMBER, "events": {"type": "array",
                                                                    "items": EVENT},
                       "after": SDG}, {"ops_before": COUNT, "ops_after": COUNT,
                                       "came_from": {"type": "object",
                                                     "propertyNames": {"pattern": "^[0-9]+$"},
                                                     "additionalProperties": COUNT}})}})
SCHEDULE = _object({"schema": _schema("schedule")},
                   {"repr": TEXT, "code": TEXTS, "method": TEXT,
                    "domains": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                                "additionalProperties": TEXT},
                    "validity": TEXTS, "tree": TEXT})
STORE = _object({"op": COUNT, "kind": TEXT, "dims": TEXTS, "slots": SIZES, "spatial": COUNTS,
                 "dtype": TEXT, "blocks": COUNTS,
                 "lifetime": {"type": "array", "items": INT, "minItems": 2, "maxItems": 2}})
MEMORY = _object({"schema": _schema("memory"), "peak_bytes": COUNT, "steps": COUNT,
                  "timeline": _object({"steps": COUNTS, "bytes": COUNTS}),
                  "stores": {"type": "array", "items": STORE}},
                 {"offloaded_bytes": COUNT, "budget": _or_null(COUNT)})
PROGRAM = _object({"schema": _schema("program"), "bounds": _mapping(COUNT), "sdg": SDG},
                  {"repr": TEXT, "executor": TEXT, "outputs": TEXTS, "trace": {"type": "object"},
                   "passes": _or_null(PASSES),
                   "schedule": _or_null(SCHEDULE),
                   "memory": _or_null(MEMORY),
                   "compile_times": _mapping(NUMBER)})

SCHEMAS = {"tempo_lab.sdg": SDG, "tempo_lab.passtrace": PASSES, "tempo_lab.schedule": SCHEDULE,
           "tempo_lab.program": PROGRAM}


@cache
def validator(kind: str):
    """A compiled check of the stage ``kind`` (``tempo_lab.sdg``, ...)."""
    import fastjsonschema

    return fastjsonschema.compile(SCHEMAS[kind])


def first_error(kind: str, data) -> str | None:
    """Where ``data`` breaks the schema of ``kind``, in words, or None if it does not."""
    import fastjsonschema

    try:
        validator(kind)(data)
    except fastjsonschema.JsonSchemaValueException as err:
        field = err.name.removeprefix("data").removeprefix(".") or "the top level"
        value = repr(err.value)
        value = value if len(value) <= 40 else value[:37] + "..."
        rule = err.message.removeprefix(err.name).strip()
        return f"field {field} is {value}: it {rule}"
    return None
