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

Which URL an AUTH names the own relay by (its ``relay`` tag) is ``AuthTags``'s: a relay checks
it against the URL it knows itself by (go-nostr's ``nip42``, so khatru with ``ServiceURL``;
LocalRelay its own address), and gsync may dial it by another (a local address behind a proxy
serving ``wss://<domain>``). A refused AUTH is answered again naming the next candidate; the
one taken is named by every connection from then on.

Nothing here logs but ``AuthTags`` (tags, never a key: a key never leaves ``auth_event``).
"""
from __future__ import annotations

import time
import weakref

from ..constants import AUTH_SETTLE_SECS
from ..ops.logging import get_logger
from ..protocol import messages as wire
from ..protocol.urls import UrlError, normalize_relay_url
from .connection import auth_event
from .ws import Timeout

log = get_logger("gsync.own_auth")


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


class AuthTags:
    """The ``relay`` tag our NIP-42 AUTH names the own relay by, for every connection to it.

    Relays compare that tag with the URL they know themselves by (scheme, host and path:
    go-nostr's ``nip42.ValidateAuthEvent``, so khatru with a ``ServiceURL``, and the relays
    built on them; LocalRelay with the address it listens on), and refuse the AUTH
    otherwise. gsync dials ``own_relay``, which may be a local address of a relay served to
    the world as ``wss://<domain>``: the candidates are that URL, then ``wss://`` and
    ``ws://`` of each configured domain. A connection whose AUTH was refused answers the same
    challenge naming the next candidate it has not tried (``next_tag``), each at most once; the
    one a relay took (``taken``) comes first for every connection from then on. A relay
    refusing them all (our key not allowed there) leaves the order as the last refusal left it.
    """

    def __init__(self, url: str, domains=()):
        tags = [url]
        for domain in domains:
            for scheme in ("wss", "ws"):
                try:
                    tags.append(normalize_relay_url(f"{scheme}://{domain}"))
                except UrlError:
                    pass
        self.tags = tuple(dict.fromkeys(tags))
        self._at = 0  # the candidate named first
        self._logged: str | None = None  # the tag last said taken (``own_relay_auth_tag``)
        self._all_refused_said = False

    @property
    def dialled(self) -> str:
        """The URL gsync dials (``own_relay``): the first candidate."""
        return self.tags[0]

    @property
    def current(self) -> str:
        return self.tags[self._at]

    def next_tag(self, tried) -> str | None:
        """The tag to name on a connection that named ``tried`` for its challenge already
        (None: every candidate was refused there)."""
        n = len(self.tags)
        for i in range(n):
            tag = self.tags[(self._at + i) % n]
            if tag not in tried:
                return tag
        return None

    def refused(self, tag: str, tried) -> None:
        """An AUTH naming ``tag`` was refused on a connection that named ``tried`` in all."""
        if tag == self.current:
            self._at = (self._at + 1) % len(self.tags)
        if len(self.tags) > 1 and set(self.tags) <= set(tried) and not self._all_refused_said:
            self._all_refused_said = True
            log.warning("own_relay_auth_refused", tags=list(self.tags))

    def taken(self, tag: str) -> None:
        """The own relay took an AUTH naming ``tag``."""
        if tag not in self.tags:
            return
        self._at = self.tags.index(tag)
        self._all_refused_said = False
        if tag != self._logged and (self._logged is not None or tag != self.dialled):
            log.info("own_relay_auth_tag", tag=tag, dialled=self.dialled)
        self._logged = tag

    def sign(self, secret: str, challenge: str, tried: set, now: int):
        """The AUTH answering ``challenge`` on a connection that named ``tried`` already (the
        tag it names is added), or None when every candidate was refused there."""
        tag = self.next_tag(tried)
        if tag is None:
            return None
        tried.add(tag)
        return auth_event(secret, tag, challenge, now), tag


class ReadAuth:
    """NIP-42 for the reads of one own relay ``url``, with the configured key ``secret``
    (None: none configured; a refusal for want of AUTH then fails its read). Per connection:
    the latest challenge, and whether it was answered (weakly kept: a closed connection's
    go with it)."""

    def __init__(self, url: str, secret: str | None, clock=time.time, tags: AuthTags | None = None):
        self.url = url
        self._secret = secret
        self._clock = clock
        self._tags = tags or AuthTags(url)
        self._challenge: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._answered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # per connection: the tags named for its challenge (``AuthTags``), and our last AUTH's
        # (event id, tag)
        self._tried: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._sent: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

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
        self._answered[ws] = challenge
        self._tried[ws] = set()
        return self._send(ws, challenge)

    def _send(self, ws, challenge: str) -> str | None:
        signed = self._tags.sign(self._secret, challenge, self._tried[ws], int(self._clock()))
        if signed is None:
            return None
        event, tag = signed
        self._sent[ws] = (event.id, tag)
        ws.send(wire.auth(event))
        return event.id

    def refused(self, ws, auth_id: str) -> str | None:
        """The relay refused our AUTH ``auth_id`` on ``ws``: answer its challenge again naming
        the next candidate tag (``AuthTags``); that AUTH's id, or None when none is left."""
        sent = self._sent.get(ws)
        if sent is None or sent[0] != auth_id:
            return None
        tried = self._tried[ws]
        self._tags.refused(sent[1], tried)
        return self._send(ws, self._challenge[ws])

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
                taken = None if auth_id is None else self.taken(ws, msg, auth_id)
                if taken is False:
                    auth_id = self.refused(ws, auth_id)  # named another way, asked again
                    if auth_id is None:
                        return False
                    deadline = time.monotonic() + AUTH_SETTLE_SECS
                elif taken:
                    return True
        finally:
            ws.settimeout(idle)
        # no answer: taken at its word (nostr_relay sends no OK to an AUTH)
        return auth_id is not None

    def taken(self, ws, msg, auth_id: str) -> bool | None:
        """The relay's answer to our AUTH ``auth_id`` on ``ws`` in ``msg``: True taken (its tag
        is named first from now on), False refused, None not an answer to it."""
        if not isinstance(msg, wire.Ok) or msg.event_id != auth_id:
            return None
        sent = self._sent.get(ws)
        if msg.accepted and sent is not None and sent[0] == auth_id:
            self._tags.taken(sent[1])
        return msg.accepted
