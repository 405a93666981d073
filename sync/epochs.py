"""Document epochs as serial numbers: which of two is newer, and the one after (issue 13).

A single-writer document starts a new epoch at each rotation (:mod:`.doc`); the epoch travels
in every frame as a u32 (:mod:`.wire`). Compared as plain integers, the u32 range has an end:
a writer at epoch 2**32 - 1 could never rotate again, and a replica that once took 2**32 - 1
(a gateway's credentials can announce any epoch of its own document) would refuse its writer
forever after, since every epoch the writer could offer is "older". So epochs compare as
serial numbers (RFC 1982, over 2**32): ``a`` is newer than ``b`` when it lies less than half
the circle ahead of it, and the epoch after 2**32 - 1 is 0. At exactly half the circle apart,
the larger is the newer one, so of two different epochs exactly one is newer.

Every comparison of epochs goes through :func:`newer`: the receive rule
(:func:`.wire.epoch_action`), a document's rotation and reset, and the store's snapshots.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EPOCH_LIMIT", "MAX_EPOCH", "after", "newer"]

#: Epochs are u32: ``0 <= epoch < EPOCH_LIMIT``.
EPOCH_LIMIT: Final = 1 << 32
MAX_EPOCH: Final = EPOCH_LIMIT - 1
_HALF: Final = 1 << 31


def newer(a: int, b: int) -> bool:
    """Whether epoch ``a`` is newer than epoch ``b`` (both u32): ``a`` lies 1 to 2**31 - 1
    ahead of ``b`` around the circle, or exactly 2**31 ahead and is the larger number."""
    ahead = (a - b) % EPOCH_LIMIT
    return 0 < ahead < _HALF or (ahead == _HALF and a > b)


def after(epoch: int) -> int:
    """The epoch that follows ``epoch`` (2**32 - 1 is followed by 0)."""
    return (epoch + 1) % EPOCH_LIMIT
