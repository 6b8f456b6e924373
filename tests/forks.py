"""LocalRelays and gsyncs forked from warm processes, instead of a new interpreter each.

Starting a relay as ``python -m gsync.ops.localrelay`` spends about 0.2 s of CPU on the
interpreter and on importing nostr-sdk; starting gsync as ``bin/gsync run`` about 0.3 s on
the interpreter, gevent's patching and importing websocket-client, requests, prometheus-client,
structlog and coincurve. The suite starts hundreds of both. Here, per pytest worker, one
process of each kind (a *zygote*) has done that once and forks a child per start; the child
then runs exactly what the subprocess would (``gsync.ops.localrelay.main``, or
``gsync.ops.cli.main`` after ``bin/gsync``'s patching) with stdin, stdout and stderr that the
test process handed over, and the test's environment. ``gsync.constants`` reads
``GSYNC_TEST_TIMERS`` at import, so gsync's own modules are imported in the zygote under the
``GSYNC_*`` variables of its first request, and again in a child whose variables differ. The child is not the test process's child, so ``ForkedProc`` watches it through a
pidfd: ``poll``, ``wait``, ``terminate`` and ``kill`` as on ``subprocess.Popen``; a gsync
child writes its exit code to a file for ``returncode``.

Two things a child inherits must not be shared, and are not:
- What the interpreter read at its start (``PYTHONPATH``, so a ``sitecustomize``,
  ``PYTHONHASHSEED``...): each zygote starts with the environment its kind always has
  (``ZYGOTE_ENV``), never with a test's. A test that changes those for its gsync (one injects
  faults through a ``sitecustomize``) gets a new interpreter (``can_fork``); forked from a
  zygote started with its environment, every later gsync of that worker had the fault.
- gevent's hub: patching makes one, with an epoll instance, and every child would share that
  one kernel object through the inherited descriptor (one child's loop taking or
  unregistering another's readiness). The gsync zygote destroys it before its first fork;
  each child makes its own on first use.

A zygote ends when the test process does (its socket closes); a relay ends when its stdin
closes, as a subprocess relay does.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# gsync's bytecode is kept between starts, outside the work tree, even where
# PYTHONDONTWRITEBYTECODE is set: compiling gsync cost each start 0.1 s of CPU.
PYCACHE = os.path.join(tempfile.gettempdir(), f"gsync-test-pycache-{os.getuid()}")


def gsync_env() -> dict:
    """The environment every gsync starts with, before a test's additions."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONPYCACHEPREFIX=PYCACHE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _interpreter_part(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def can_fork(env: dict) -> bool:
    """May a gsync with ``env`` be forked from the zygote? Not when the test changed what the
    interpreter reads at its start, nor when ``GSYNC_TEST_FORK=0`` asks for new interpreters."""
    return (os.environ.get("GSYNC_TEST_FORK", "1") != "0"
            and _interpreter_part(env) == _interpreter_part(gsync_env()))


_lock = threading.Lock()
# The zygotes fork and set signals with these, not with what gevent's patching puts in their
# place (a fork watched by a gevent hub, SIGCHLD routed through one).
_real_fork, _real_signal = os.fork, signal.signal
_zygotes: dict[str, tuple[subprocess.Popen, socket.socket]] = {}


class ForkedProc:
    """The part of ``subprocess.Popen`` the tests use, for a child of a zygote."""

    def __init__(self, pid: int, stdin=None, stdout=None, exit_file: str | None = None):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.exit_file = exit_file
        self.returncode: int | None = None
        self._signalled = 0
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already
            self._pidfd = None
            self._read_exit_code()

    def _read_exit_code(self) -> None:
        """The zygote reaps its children, so their exit status is not ours to read: a child
        that writes its code (gsync) tells it; one killed by a signal we sent ends with that
        signal's negative, as ``Popen`` says; otherwise -1."""
        code = -self._signalled if self._signalled else -1
        if self.exit_file and os.path.exists(self.exit_file):
            with open(self.exit_file) as fh:
                code = int(fh.read() or code)
        self.returncode = code

    def _ended(self, timeout: float | None) -> bool:
        if self._pidfd is None:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], timeout)
        if not ready:
            return False
        os.close(self._pidfd)
        self._pidfd = None
        self._read_exit_code()
        return True

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
                if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                    self._signalled = sig
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_relay(options: dict, stderr_path: str | None, env: dict) -> ForkedProc:
    """A LocalRelay child of the relay zygote (started with ``env``, the environment every
    relay has), running with ``options`` (see ``gsync.ops.localrelay``); its stderr
    appended to ``stderr_path`` or discarded."""
    child_in, our_in = os.pipe()
    our_out, child_out = os.pipe()
    err = os.open(stderr_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pid = _fork("relay", env, options, [child_in, child_out, err])
    finally:
        for fd in (child_in, child_out, err):
            os.close(fd)
    return ForkedProc(pid, os.fdopen(our_in, "w"), os.fdopen(our_out, "r"))


def fork_gsync(argv: list[str], env: dict, log_path: str) -> ForkedProc:
    """``bin/gsync *argv`` as a child of the gsync zygote, with ``env`` as its environment
    (``can_fork(env)``), stdin empty and stdout and stderr appended to ``log_path``."""
    exit_file = log_path + ".exit"
    if os.path.exists(exit_file):
        os.unlink(exit_file)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        pid = _fork("gsync", gsync_env(), {"argv": argv, "env": env, "cwd": os.getcwd(), "exit_file": exit_file},
                    [null, log, log])
    finally:
        os.close(null)
        os.close(log)
    return ForkedProc(pid, exit_file=exit_file)


def _fork(kind: str, zygote_env: dict, request: dict, fds: list[int]) -> int:
    with _lock:
        zygote = _zygotes.get(kind)
        if zygote is None or zygote[0].poll() is not None:
            zygote = _zygotes[kind] = _start_zygote(kind, zygote_env)
        sock = zygote[1]
        socket.send_fds(sock, [json.dumps(request).encode()], fds)
        answer = sock.recv(64)
    if not answer:
        raise RuntimeError(f"the {kind} zygote died")
    return int(answer)


def _start_zygote(kind: str, env: dict) -> tuple[subprocess.Popen, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-m", "tests.forks", kind, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    theirs.close()
    return proc, ours


# -- in the zygotes -----------------------------------------------------------------------


def _relay_runner():
    """(prepare, run) for a relay zygote: nothing to prepare; run serves the request."""
    import asyncio  # noqa: F401 - imported before the forks, which then need not

    import nostr_sdk  # noqa: F401

    from gsync.ops import localrelay

    return (lambda request: None), (lambda request: localrelay.main([json.dumps(request)]))


def _gsync_runner():
    """(prepare, run) for a gsync zygote: prepare imports gsync in the zygote (see below)."""
    from gevent._hub_local import get_hub_if_exists

    from gsync.ops.cli import patch_for_gevent

    patch_for_gevent()  # as bin/gsync does, before anything imports socket
    import coincurve  # noqa: F401 - what gsync imports, once, before the forks
    import prometheus_client  # noqa: F401
    import structlog  # noqa: F401
    import websocket  # noqa: F401

    def drop_hub():  # see the module's docstring: never shared with the children
        hub = get_hub_if_exists()
        if hub is not None:
            hub.destroy(destroy_loop=True)

    def drop_gsync():
        for name in [name for name in sys.modules if name == "gsync" or name.startswith("gsync.")]:
            del sys.modules[name]

    drop_hub()
    drop_gsync()
    imported_for = None  # the GSYNC_* environment gsync's modules were imported under here

    def gsync_vars(env: dict) -> tuple:
        return tuple(sorted((k, v) for k, v in env.items() if k.startswith("GSYNC_")))

    def prepare(request: dict) -> None:
        """In the zygote, before its first gsync fork: import gsync as that child would, under
        the request's GSYNC_* variables (gsync.constants reads them at import), so children
        with the same ones (nearly all: the suite's timers) need not import it again (0.1 s of
        CPU each, 200 starts a run)."""
        nonlocal imported_for
        if imported_for is not None:
            return
        saved = dict(os.environ)
        os.environ.update(dict(gsync_vars(request["env"])))
        try:
            import gsync.io.runner  # noqa: F401
            import gsync.ops.cli  # noqa: F401
        finally:
            os.environ.clear()
            os.environ.update(saved)
        drop_hub()
        imported_for = gsync_vars(request["env"])

    def run(request: dict) -> int:
        if gsync_vars(request["env"]) != imported_for:
            drop_gsync()  # imported anew, after the environment is set
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = list(request["argv"])
        from gsync.ops.cli import main

        return main(sys.argv[1:])

    return prepare, run


def _serve(kind: str, fd: int) -> None:
    """A zygote: the command socket made before ``kind``'s imports (gsync's patch the socket
    module, and this one must block the plain way, not through a hub), then a fork per
    request."""
    sock = socket.socket(fileno=fd)
    prepare, run = _relay_runner() if kind == "relay" else _gsync_runner()
    _real_signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            return
        if not msg:
            return  # the test process ended
        request = json.loads(msg)
        prepare(request)  # in the zygote, before the fork
        pid = _real_fork()
        if pid == 0:
            sock.close()
            _child(run, request, fds)
        for source in fds:
            os.close(source)
        sock.send(str(pid).encode())


def _child(run, request: dict, fds: list[int]) -> None:
    code = 1
    try:
        _real_signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, source in enumerate(fds):
            os.dup2(source, target)
            os.close(source)
        code = run(request)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        code = code or 0
        if "exit_file" in request:
            with open(request["exit_file"], "w") as fh:
                fh.write(str(code))
        os._exit(code)


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
