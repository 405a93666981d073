"""Write TOML: the inverse of ``tomllib.loads`` for the values a config holds.

Role: ``edgesched install`` reads a config with ``tomllib``, changes a few keys and writes it
back; the standard library reads TOML but does not write it. Tables, arrays of tables,
strings, integers, floats (inf and nan included), booleans, dates and times, arrays and
inline tables. Comments of the source are not kept.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_dumps(data: Mapping[str, Any]) -> str:
    """TOML text such that ``tomllib.loads(toml_dumps(d)) == d``; ValueError for a value TOML
    cannot hold (None, sets, objects)."""
    out: list[str] = []
    _table(data, (), out, None)
    return "\n".join(out).strip("\n") + "\n"


def _table(
    data: Mapping[str, Any], path: tuple[str, ...], out: list[str], header: str | None
) -> None:
    scalars = [(k, v) for k, v in data.items() if not _is_table(v) and not _is_table_array(v)]
    tables = [(k, v) for k, v in data.items() if _is_table(v)]
    arrays = [(k, v) for k, v in data.items() if _is_table_array(v)]
    # A table's header may be left out when only sub-tables follow; an array element's never.
    if header is not None and (header.startswith("\n[[") or scalars or not (tables or arrays)):
        out.append(header)
    out += [f"{_key(k)} = {_value(v)}" for k, v in scalars]
    for k, v in tables:
        _table(v, (*path, k), out, f"\n[{_dotted((*path, k))}]")
    for k, items in arrays:
        for item in items:
            _table(item, (*path, k), out, f"\n[[{_dotted((*path, k))}]]")


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_key(p) for p in path)


def _is_table(v: object) -> bool:
    return isinstance(v, Mapping)


def _is_table_array(v: object) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(i, Mapping) for i in v)


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else _string(k)


def _string(s: str) -> str:
    # A JSON string is a TOML basic string, but for two things: JSON writes characters beyond
    # U+FFFF as surrogate pairs (TOML refuses them: written as they are instead), and leaves
    # DEL unescaped (TOML refuses it unescaped).
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(i)}" for k, i in v.items()) + " }"
    raise ValueError(f"cannot write a {type(v).__name__} as TOML")
