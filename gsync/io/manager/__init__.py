"""The manager: one greenlet owning every sync index (see ``core``); its concerns live in
mixins, one module each: ``lifecycle``, ``live``, ``historic``, ``own_relay``,
``descendants``, ``refusals`` (relays that throttle, refuse or go silent).
"""
from .core import SyncManager

__all__ = ["SyncManager"]
