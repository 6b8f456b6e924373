"""The manager: one greenlet owning every sync index (see ``core``); its concerns are
objects it owns, one module each: ``lifecycle``, ``live``, ``historic`` (executing the
historic planner's decisions), ``completion``, ``own_reads``, ``own_relay``, ``descendants``,
``refusals`` (relays that throttle, refuse or go silent), ``saved_state``; ``coverage``
holds the filters a relay is asked for.
"""
from .core import SyncManager

__all__ = ["SyncManager"]
