"""``summary.json``: the report as data, and the JSON Schema it follows.

The schema ships beside this module (``summary.schema.json``, JSON Schema draft
2020-12, ``$id`` ``urn:dspark-obs:report-summary:1``).  Versioning:
``schema_version`` is semantic — a minor bump only adds optional fields, a
major bump changes or removes one (and the ``$id``'s last number).  Every field
is described in the schema.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["SCHEMA_VERSION", "SCHEMA_ID", "schema", "validate", "dumps"]

SCHEMA_VERSION = "1.0.0"
SCHEMA_ID = "urn:dspark-obs:report-summary:1"


def schema() -> dict[str, Any]:
    """The JSON Schema of ``summary.json`` (a dict)."""
    text = resources.files("dspark_obs.report").joinpath("summary.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(summary: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``summary`` follows the schema (needs ``jsonschema``)."""
    import jsonschema  # why: an optional package (the test extra); only validation needs it

    jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker()).validate(summary)


def dumps(summary: dict[str, Any]) -> str:
    """The summary as indented JSON (NaN is not JSON: figures carry null instead)."""
    return json.dumps(summary, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
