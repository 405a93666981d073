"""One shared copy of equal immutable values that central decodes again and again.

At 10,000 nodes central holds a million task entries decoded, and they carry the same few
CPU and memory sizes, commands and assignment references: each decoded copy is an object of
its own (a float 24 bytes, a tuple 56 or more, a small frozen entry 60 to 170). A
:class:`SharedValues` table hands back the first equal value it was given instead.

Each table is bounded (:data:`SHARED_UP_TO` values): once full it hands values back as they
are, which is correct, only not shared, so a writer of ever new values cannot grow it without
limit. Python's equality is looser than a value's identity (``1 == 1.0 == True``, ``0.0 ==
-0.0``), so a caller shares only values whose types it has checked exactly, and no negative
zeros: :func:`shared_float` and :func:`shared_text_tuple` do it for floats and tuples of text.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

#: Values one table shares at most.
SHARED_UP_TO = 1 << 16
#: Floats shared: positive, at most this, and a multiple of 1/64 (sizes people configure:
#: 0.25 CPU, 1.5 GiB; a timestamp or a measured load is not one and would fill the table).
SHARED_FLOAT_UP_TO = 4096.0

_T = TypeVar("_T", bound=Hashable)
_Tuple = TypeVar("_Tuple", bound=tuple[object, ...])


class SharedValues(Generic[_T]):
    """A bounded table: ``table(value)`` is the first value equal to ``value`` it was given
    (``value`` itself the first time, and once the table is full)."""

    __slots__ = ("_values", "limit")

    def __init__(self, limit: int = SHARED_UP_TO) -> None:
        self._values: dict[_T, _T] = {}
        self.limit = limit

    def __call__(self, value: _T) -> _T:
        shared = self._values.get(value)
        if shared is not None:
            return shared
        if len(self._values) < self.limit:
            self._values[value] = value
        return value

    def __len__(self) -> int:
        return len(self._values)


_FLOATS: SharedValues[float] = SharedValues()
_TEXT_TUPLES: SharedValues[tuple[str, ...]] = SharedValues()


def shared_float(value: float) -> float:
    """``value`` (a float), shared if it is a size (see :data:`SHARED_FLOAT_UP_TO`)."""
    if 0.0 < value <= SHARED_FLOAT_UP_TO and (value * 64.0).is_integer():
        return _FLOATS(value)
    return value


def shared_text_tuple(value: _Tuple) -> _Tuple:
    """``value``, shared if every item is exactly a str (a command line)."""
    if type(value) is tuple and all(type(item) is str for item in value):
        return _TEXT_TUPLES(value)  # type: ignore[arg-type,return-value]
    return value


def exact_zero_free(*values: float) -> bool:
    """Whether no value is a negative zero (one that equality would share as ``0.0``)."""
    return all(v != 0.0 or math.copysign(1.0, v) > 0 for v in values)
