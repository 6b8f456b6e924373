"""A second real relay implementation for tests: nostr_relay (PyPI ``nostr-relay``, Dave
St.Germain's Python relay on SQLite, served by uvicorn), in a subprocess on a free loopback
port. It differs from LocalRelay where relays in the wild differ: it reads ``until`` as
exclusive, serves NIP-11 (without 77: no NIP-77), clamps a REQ's ``limit`` to its
``max_limit``, and answers a REQ without ``limit`` whole (PEERS.md)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from .relays import free_port

CONFIG = """\
relay_name: gsync test peer
relay_description: nostr_relay for gsync's tests
storage:
  sqlalchemy.url: sqlite+aiosqlite:///{dir}/relay.sqlite3
  num_concurrent_reqs: 10
  num_concurrent_adds: 2
  validators:
    - nostr_relay.validators.is_signed
verification:
  nip05_verification: disabled
  expiration: 2592000
  update_frequency: 3600
authentication:
  enabled: {auth}
  relay_urls:
    - ws://127.0.0.1:{port}
  actions:
    save: a
    query: {query_roles}
gunicorn:
  bind: 127.0.0.1:{port}
  workers: 1
  loglevel: warning
purple:
  host: 127.0.0.1
  port: {port}
  workers: 1
  disable_compression: true
message_timeout: 1800
subscription_limit: {subscription_limit}
max_limit: {max_limit}
max_event_size: 100000
hellthread_limit: 0
"""


def executable() -> str:
    """The ``nostr-relay`` script of the interpreter running the tests (``setup.py``'s test
    extra installs it)."""
    found = os.path.join(os.path.dirname(sys.executable), "nostr-relay")
    return found if os.path.exists(found) else (shutil.which("nostr-relay") or found)


class NostrRelayProcess:
    def __init__(self, max_limit: int = 6000, readers: tuple[str, ...] | None = None,
                 subscription_limit: int = 32):
        """``readers``: NIP-42 on, and only these pubkeys may query (anyone may publish);
        ``subscription_limit``: the REQs a connection may hold open (past it, a NOTICE
        ``rejected: too many subscriptions``, naming none)."""
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.max_limit = max_limit
        self.readers = readers
        self.subscription_limit = subscription_limit
        self.dir = tempfile.mkdtemp(prefix="nostr-relay-")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> NostrRelayProcess:
        config = os.path.join(self.dir, "config.yaml")
        with open(config, "w") as fh:
            fh.write(CONFIG.format(dir=self.dir, port=self.port, max_limit=self.max_limit,
                                   auth="true" if self.readers is not None else "false",
                                   query_roles="r" if self.readers is not None else "a",
                                   subscription_limit=self.subscription_limit))
        with open(os.path.join(self.dir, "relay.log"), "wb") as log:
            self.proc = subprocess.Popen([executable(), "-c", config, "serve", "--use-uvicorn"],
                                         cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nostr-relay exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"nostr-relay did not listen on {self.port} within {timeout} s: {self.log_tail()}")
        for pubkey in self.readers or ():
            subprocess.run([executable(), "-c", config, "role", "set", "-p", pubkey, "-r", "r"],
                           cwd=self.dir, check=True, capture_output=True, timeout=timeout)
        return self

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "relay.log"), errors="replace") as fh:
                return fh.read()[-2000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
