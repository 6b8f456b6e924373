"""How long a delivery the own relay refused without saying it is final is retried (SPEC §2,
§8: every wait has an end).

Pure. ``error:``, an unknown prefix or none at all may be a passing fault (a busy database)
or a permanent one said in words gsync does not know: retried quickly at first, then less
and less often, ``DELIVERY_MAX_ATTEMPTS`` attempts over about an hour; then given up, as a
refusal (the manager keeps it in the rejected index, so it is not fetched again for a week).
An event held for ever would hold its share of the backlog, and with enough of them
historic sync, for good.
"""
from __future__ import annotations

from .. import constants


def refusal_retry_delay(attempts: int) -> float | None:
    """Seconds before the next attempt of an event refused ``attempts`` times so far (1 or
    more), or None: give up. 0.5 s, 2, 8, 32, 128, 512, then 20 minutes: ten attempts over
    about 70 minutes."""
    if attempts >= constants.DELIVERY_MAX_ATTEMPTS:
        return None
    return min(constants.DELIVERY_RETRY_MAX_SECS, constants.DELIVERY_RETRY_BASE_SECS * 4 ** (attempts - 1))
