"""NIP-11 relay information: the limits that bound how gsync may subscribe (SPEC §3).

Pure: takes the fetched document, returns ``RelayLimits``. Documents come from untrusted
relays, and many relays serve none, so any problem means "that limit is unknown" — never
an exception.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..constants import DEFAULT_MAX_SUBSCRIPTIONS


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """A relay's published ``limitation`` values; None means it did not say (no limit known)."""

    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_message_length: int | None = None
    max_limit: int | None = None
    max_subid_length: int | None = None
    max_filters: int | None = None  # removed from NIP-11 in 2025; older relays still send it
    # the most values one list of a filter may hold (its ids, authors or one tag's): no NIP-11
    # key says it; learnt from a refusal (``Refusals.learn_max_values``)
    max_values: int | None = None
    auth_required: bool = False
    supported_nips: frozenset[int] = field(default_factory=frozenset)
    software: str = ""  # its ``software`` (a URL naming the implementation), at most 200 characters


_LIMIT_KEYS = ("max_subscriptions", "max_message_length", "max_limit", "max_subid_length", "max_filters")


def _positive_int(value: object) -> int | None:
    """A positive count, also as relays misspell it: a string of digits (``"500"``) or a
    whole float (``500.0``). Anything else is no limit known."""
    # bool is an int subclass in Python; JSON true is not a limit.
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip()) if len(value.strip()) <= 18 else None
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def parse_nip11(document: str | bytes | bytearray | None) -> RelayLimits:
    """Limits from a NIP-11 document; defaults for whatever is missing, malformed or absurd."""
    try:
        info = json.loads(document) if document else None
    except (ValueError, TypeError, RecursionError):
        info = None
    if not isinstance(info, dict):
        return RelayLimits()
    limitation = info.get("limitation")
    if not isinstance(limitation, dict):
        limitation = {}
    limits = {key: _positive_int(limitation.get(key)) for key in _LIMIT_KEYS}
    if limits["max_subscriptions"] is None:
        limits["max_subscriptions"] = DEFAULT_MAX_SUBSCRIPTIONS
    nips = info.get("supported_nips")
    return RelayLimits(
        **limits,
        auth_required=limitation.get("auth_required") in (True, "true", "True"),
        supported_nips=frozenset(
            n for n in map(_positive_int, nips if isinstance(nips, list) else ()) if n is not None
        ),
        software=info["software"][:200] if isinstance(info.get("software"), str) else "",
    )
