"""NIP-42 on gsync's reads of the own relay (SPEC §5: a relay that sends ``AUTH`` while a
key is configured is answered, and what it refused is sent again).

An own relay may ask for AUTH to read as well as to write (LocalRelay's ``nip42`` BOTH, a
khatru relay whose ``RejectFilter`` asks it of every REQ). Delivery authenticated its lanes,
but the reads did not: the self-subscription and every holdings read were refused
``auth-required:``, so gsync never learnt what the own relay accepted and synced nothing.

A relay sends its challenge at connect or with a refusal (LocalRelay and khatru do the
latter, nostr_relay the former); whichever frame it comes in, it is kept for its connection
(``note``). A read refused ``auth-required:`` (or ``restricted:`` by a relay that challenged
us: nostr_relay's NOTICE to each REQ read before the AUTH it asked for), on a connection not
authenticated yet, with a key and a challenge, is answered (``authenticate``: AUTH, then the
relay's OK to it, or ``AUTH_SETTLE_SECS`` of silence from a relay that sends none, as
nostr_relay) and asked once more; refused again, or the AUTH refused, it fails as any refused read does (its caller's
session tries again later). The live subscription cannot wait in place: it sends the AUTH
(``answer``), reads on, and sends its REQs again at the OK (``taken``) or after that silence.

Nothing here logs: a key never leaves ``auth_event``.
"""
from __future__ import annotations

import time
import weakref

from ..constants import AUTH_SETTLE_SECS
from ..protocol import messages as wire
from .connection import auth_event
from .ws import Timeout


def refusal_for_auth(msg, challenged: bool = False) -> bool:
    """Is ``msg`` a relay refusing for want of AUTH (a CLOSED, or a NOTICE, ``auth-required:``;
    or ``restricted:`` from one that ``challenged`` us on that connection: nostr_relay says
    ``restricted: permission denied`` to each REQ read before the AUTH it asked for)?"""
    if isinstance(msg, wire.Closed):
        prefix = msg.prefix
    elif isinstance(msg, wire.Notice):
        prefix = wire.split_prefix(msg.text)[0]
    else:
        return False
    return prefix is wire.Prefix.AUTH_REQUIRED or (challenged and prefix is wire.Prefix.RESTRICTED)


class ReadAuth:
    """NIP-42 for the reads of one own relay ``url``, with the configured key ``secret``
    (None: none configured; a refusal for want of AUTH then fails its read). Per connection:
    the latest challenge, and whether it was answered (weakly kept: a closed connection's
    go with it)."""

    def __init__(self, url: str, secret: str | None, clock=time.time):
        self.url = url
        self._secret = secret
        self._clock = clock
        self._challenge: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._answered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def has_key(self) -> bool:
        return bool(self._secret)

    def refusal(self, text: str) -> str:
        """What the relay refused with, ``text``, and, without a key, what would answer it."""
        return text if self._secret else f"{text} (no [auth] key_file to answer it with)"

    def note(self, ws, msg) -> bool:
        """Keep ``msg``'s challenge if it is one (True), for the connection ``ws``."""
        if isinstance(msg, wire.AuthChallenge):
            self._challenge[ws] = msg.challenge
            return True
        return False

    def challenged(self, ws) -> bool:
        """Did the relay send a challenge on ``ws``?"""
        return ws in self._challenge

    def can_answer(self, ws) -> bool:
        """A key, and a challenge on ``ws`` not answered yet."""
        challenge = self._challenge.get(ws)
        return bool(self._secret) and challenge is not None and self._answered.get(ws) != challenge

    def answer(self, ws) -> str | None:
        """Send the AUTH answering ``ws``'s challenge; its event id (None: none to send)."""
        if not self.can_answer(ws):
            return None
        challenge = self._challenge[ws]
        event = auth_event(self._secret, self.url, challenge, int(self._clock()))
        self._answered[ws] = challenge
        ws.send(wire.auth(event))
        return event.id

    def authenticate(self, ws) -> bool:
        """Answer ``ws``'s challenge (the next one the relay sends, if none came yet) and
        wait for the relay to take it: True once it said OK true, or said nothing for
        ``AUTH_SETTLE_SECS``; False with no key, a challenge answered already, none within
        that time, or our AUTH refused. Other frames meanwhile are dropped (the caller has
        no read open)."""
        if not self._secret or (ws in self._answered and self._answered.get(ws) == self._challenge.get(ws)):
            return False
        auth_id = self.answer(ws)
        idle = ws.timeout
        deadline = time.monotonic() + AUTH_SETTLE_SECS
        try:
            while (left := deadline - time.monotonic()) > 0:
                ws.settimeout(left)
                try:
                    msg = wire.parse_relay_message(ws.recv())
                except Timeout:
                    break
                if self.note(ws, msg):
                    if auth_id is None:  # the challenge came after the refusal
                        auth_id = self.answer(ws)
                        deadline = time.monotonic() + AUTH_SETTLE_SECS
                    continue
                taken = None if auth_id is None else self.taken(msg, auth_id)
                if taken is not None:
                    return taken
        finally:
            ws.settimeout(idle)
        # no answer: taken at its word (nostr_relay sends no OK to an AUTH)
        return auth_id is not None

    @staticmethod
    def taken(msg, auth_id: str) -> bool | None:
        """The relay's answer to our AUTH ``auth_id`` in ``msg``: True taken, False refused,
        None not an answer to it."""
        if isinstance(msg, wire.Ok) and msg.event_id == auth_id:
            return msg.accepted
        return None
