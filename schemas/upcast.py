"""Upcasters: pure functions that lift an old event payload to the next schema version.

An event whose shape must change in a way defaults cannot express gets ``version = N + 1`` on its
class and an upcaster registered for ``(tag, N)``. Decoding an envelope of version ``N`` applies
every upcaster from ``N`` to the current version. Upcasters work on plain dicts (the payload as
decoded without a schema), so they never depend on a class that has since changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]

UPCASTERS: dict[tuple[str, int], Upcaster] = {}
"""Upcaster from version ``n`` to ``n + 1`` of a tag, by ``(tag, n)``. None are needed yet."""


class UpcastError(ValueError):
    """An event's version cannot be brought to the current one."""


def upcast(
    tag: str,
    version: int,
    payload: Payload,
    current: int,
    upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
) -> Payload:
    """Lift ``payload`` of ``tag`` from ``version`` to ``current``.

    Args:
        tag: the event's tag.
        version: the schema version the payload was written with.
        payload: the event as a plain dict (its ``type`` field included).
        current: the version the reader understands.
        upcasters: the registry (injected for tests).

    Returns:
        The payload in the current version's shape.

    Raises:
        UpcastError: the payload is newer than the reader, or a step is missing.

    """
    if version > current:
        raise UpcastError(
            f"event {tag!r} has schema version {version}, newer than the {current} this "
            "reader knows: upgrade the reader"
        )
    while version < current:
        step = upcasters.get((tag, version))
        if step is None:
            raise UpcastError(f"no upcaster for {tag!r} from version {version}")
        payload = step(dict(payload))
        version += 1
    return payload
