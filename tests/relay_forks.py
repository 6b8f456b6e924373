"""LocalRelays forked from one warm process per test worker, instead of a new interpreter each.

Starting a relay as ``python -m gsync.ops.localrelay`` spends about 0.2 s of CPU on the
interpreter and on importing nostr-sdk, and the suite starts hundreds of them. Here one
process per pytest worker (the *zygote*) imports all that once and forks a child per relay;
the child then runs ``gsync.ops.localrelay.main`` exactly as the subprocess would, with
stdin, stdout and stderr that the test process handed over. The relay is not the test
process's child, so ``ForkedProc`` watches it through a pidfd: ``poll``, ``wait``,
``terminate`` and ``kill`` as on ``subprocess.Popen``.

gsync itself is not started so (``tests/gsync_proc.py`` runs a new ``bin/gsync`` each time):
forked from a warm gevent process, one NIP-77 exchange in a few hundred gsync starts never
concluded, with or without ``gevent.reinit()`` in the child (six full runs on a loaded
machine: 2-5 such failures each; with new interpreters, none).

The zygote ends when the test process does (its socket closes); each relay ends when its
stdin closes, as a subprocess relay does.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

_lock = threading.Lock()
_zygote: tuple[subprocess.Popen, socket.socket] | None = None


class ForkedProc:
    """The part of ``subprocess.Popen`` the tests use, for a relay forked by the zygote."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            self._pidfd, self.returncode = None, -1

    def _ended(self, timeout: float | None) -> bool:
        if self._pidfd is None:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], timeout)
        if not ready:
            return False
        os.close(self._pidfd)
        # the zygote reaps its children: the exit status is not ours to read
        self._pidfd, self.returncode = None, -1
        return True

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(f"relay {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_relay(options: dict, stderr_path: str | None, env: dict) -> ForkedProc:
    """A LocalRelay child of the zygote, running with ``options`` (see
    ``gsync.ops.localrelay``); its stderr appended to ``stderr_path`` or discarded."""
    global _zygote
    child_in, our_in = os.pipe()
    our_out, child_out = os.pipe()
    err = os.open(stderr_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with _lock:
            if _zygote is None or _zygote[0].poll() is not None:
                _zygote = _start_zygote(env)
            sock = _zygote[1]
            socket.send_fds(sock, [json.dumps(options).encode()], [child_in, child_out, err])
            answer = sock.recv(64)
        if not answer:
            raise RuntimeError("the relay zygote died")
        pid = int(answer)
    finally:
        for fd in (child_in, child_out, err):
            os.close(fd)
    return ForkedProc(pid, os.fdopen(our_in, "w"), os.fdopen(our_out, "r"))


def _start_zygote(env: dict) -> tuple[subprocess.Popen, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-m", "tests.relay_forks", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
    theirs.close()
    return proc, ours


def _serve(fd: int) -> None:
    """The zygote: everything a relay imports, imported once; a fork per request."""
    import asyncio  # noqa: F401 - imported before the forks, which then need not

    import nostr_sdk  # noqa: F401

    from gsync.ops import localrelay

    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            return
        if not msg:
            return  # the test process ended
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                for target, source in enumerate(fds):
                    os.dup2(source, target)
                    os.close(source)
                code = localrelay.main([msg.decode()])
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code or 0)
        for source in fds:
            os.close(source)
        sock.send(str(pid).encode())


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
