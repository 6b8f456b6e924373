"""What the historic planner (``sync.planner``, ``sync.batch_end``) asks the manager to do:
each action crosses into I/O or into another of the manager's concerns, and
``io.manager.historic`` executes them in the order they were asked. Pure data."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Start:
    """The queued start that goes now (``HistoricPlanner.next_start``): a REQ, or a NIP-77
    exchange (``holdings``: what the own relay holds of what it asks, and a part of it
    whose holdings are not known, for the exchange to read; ``asks``: the filter its
    NEG-OPEN sends, ``pending.exchange_asks``)."""

    sub_id: str
    filters: list
    batch: Any
    holdings: tuple | None = None
    asks: Any = None


AGAIN = "again"  # ``next_start``: no start yet, the queue is to be asked again (once its actions are done)


@dataclass(frozen=True)
class Log:
    level: str  # "debug", "info", "warning"
    event: str
    fields: dict


class LogActions:
    """A logger's face for the planner: each line it would log is a ``Log`` action in
    ``todo``, logged by the manager when it executes them."""

    def __init__(self, todo: list):
        self.todo = todo

    def debug(self, event: str, **fields) -> None:
        self.todo.append(Log("debug", event, fields))

    def info(self, event: str, **fields) -> None:
        self.todo.append(Log("info", event, fields))

    def warning(self, event: str, **fields) -> None:
        self.todo.append(Log("warning", event, fields))


@dataclass(frozen=True)
class Count:
    """Add ``n`` to the metric named ``metric`` (``ops.metrics``), under ``labels``."""

    metric: str
    labels: tuple
    n: int = 1


@dataclass(frozen=True)
class ReadOwn:
    """Read what the own relay holds (``reads``) for a batch, with the next merged read;
    ``filters`` are answered (``OwnHoldingsRead``) once it lands (none: it reads ahead)."""

    state: Any
    batch_id: int
    token: str
    filters: list
    reads: list
    follower: bool
    ahead: bool = False


@dataclass(frozen=True)
class AwaitRead:
    """A read under way reads values of ``filters``: ask again once it lands."""

    state: Any
    batch_id: int
    token: str
    filters: list
    follower: bool


@dataclass(frozen=True)
class OwnKnown:
    """Every filter's holdings are known: the batch's answer (``OwnHoldingsRead``) now."""

    state: Any
    batch_id: int
    token: str
    filters: list
    holdings: list


@dataclass(frozen=True)
class Close:
    """CLOSE a historic REQ on the relay (its EOSE came)."""

    state: Any
    sub_id: str


@dataclass(frozen=True)
class Pump:
    """Start what the relay's queue and gates allow."""

    state: Any


@dataclass(frozen=True)
class Advance:
    """Pump (unless not ``pump``), then finish the batch if nothing of it is outstanding."""

    state: Any
    batch: Any
    pump: bool = True


@dataclass(frozen=True)
class ExchangesEnded:
    """The batch's last exchange ended without an answer (dropped before it started):
    fetch what its other exchanges found (``batch_end.fetch_what_the_exchanges_found``)."""

    state: Any
    batch: Any


@dataclass(frozen=True)
class Served:
    """The relay served a request (a rate-limit episode's probing is over)."""

    state: Any


@dataclass(frozen=True)
class RateLimited:
    state: Any
    reason: str


@dataclass(frozen=True)
class CoverLive:
    """Cover ``filters`` live from now, for ``items``."""

    state: Any
    filters: list
    items: Any


@dataclass(frozen=True)
class Confirmed:
    """A batch is done with (confirmed, failed or not): its probe answered, if it was one;
    the relay's historic sync checked for completion."""

    state: Any
    batch: Any
    probed: Any = None


@dataclass(frozen=True)
class RecoveryFinished:
    """A recovery attempt is done with: the relay may be recovered, its sync complete."""

    state: Any
