"""systemd notifications (sd_notify): READY=1, STATUS=…, WATCHDOG=1, STOPPING=1.

Fifteen lines of datagram socket code rather than a dependency: the protocol is one
``NOTIFY_SOCKET`` datagram per message, and does nothing when not run by systemd.
"""
import os
import socket


def notify(message: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC in seconds, if systemd asked for watchdog pings (for us)."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
