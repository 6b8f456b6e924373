"""``gsync status``: ask the running instance how its relays are doing.

It reads ``GET /status`` on the ``[metrics] listen`` address of the instance's config file
(or ``--url``) and prints a header (own relay up or down, ready, repositories, delivery
backlog), the sync round's progress in one line (``sync.progress.progress_line``: repositories
complete, relays synced, events delivered, starts queued, time left), and one line per remote
relay: connection status, health, open subscriptions, events delivered from it, starts
queued, last error. ``--json`` prints the endpoint's JSON as is, for scripts.

Only ``[metrics] listen`` is read from the config file — not the whole file through the
checker — so an operator who cannot read the NIP-42 key file can still ask for the status.
Exit codes: 0 answered, 1 the instance cannot be reached or answered nonsense, 2 bad usage
or a config file that does not say where the instance listens.
"""
from __future__ import annotations

import argparse
import configparser
import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_CONFIG_PATH = "/etc/gsync/gsync.ini"
DEFAULT_LISTEN = "127.0.0.1:9464"
EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE = 0, 1, 2
MAX_ERROR_WIDTH = 60


class StatusError(Exception):
    def __init__(self, message: str, code: int = EXIT_UNREACHABLE):
        super().__init__(message)
        self.code = code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gsync status",
        description="Show the relays of the running gsync instance (from its /status endpoint).",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config", metavar="FILE",
                       help=f"the instance's INI file; its [metrics] listen is asked "
                            f"(default {DEFAULT_CONFIG_PATH}, or {DEFAULT_LISTEN} if that "
                            f"file does not exist)")
    where.add_argument("--url", metavar="URL",
                       help="the instance's metrics endpoint, e.g. http://127.0.0.1:9464")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECS",
                        help="how long to wait for an answer (default 5)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.url:
            url = status_url(args.url)
        elif args.config is None and not os.path.exists(DEFAULT_CONFIG_PATH):
            url = status_url(DEFAULT_LISTEN)
        else:
            url = url_from_config(args.config or DEFAULT_CONFIG_PATH)
        status = fetch_status(url, args.timeout)
    except StatusError as exc:
        print(f"gsync status: {exc}", file=sys.stderr)
        return exc.code
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(status))
    return EXIT_OK


# -- where the instance listens -------------------------------------------------------------


def status_url(base: str) -> str:
    """``http://host:port`` (any path after it is ignored) → ``http://host:port/status``."""
    base = base.strip()
    if "://" not in base:
        base = "http://" + base
    scheme, _, rest = base.partition("://")
    if scheme not in ("http", "https"):
        raise StatusError(f"--url must be an http:// URL, not {base!r}", EXIT_USAGE)
    authority = rest.split("/", 1)[0]
    if not authority:
        raise StatusError(f"--url has no host: {base!r}", EXIT_USAGE)
    return f"{scheme}://{authority}/status"


def url_from_config(path: str) -> str:
    from ..protocol.urls import UrlError, split_host_port

    parser = configparser.ConfigParser(interpolation=None, default_section="\0none", strict=False)
    try:
        with open(path, encoding="utf-8") as fh:
            parser.read_file(fh)
    except OSError as exc:
        raise StatusError(f"cannot read {path}: {exc.strerror or exc} (give --config FILE or "
                          f"--url http://HOST:PORT)", EXIT_USAGE) from None
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise StatusError(f"{path} is not a valid INI file: {exc}", EXIT_USAGE) from None
    listen = parser.get("metrics", "listen", fallback=DEFAULT_LISTEN).strip()
    if not listen:
        raise StatusError(f"{path}: [metrics] listen is empty, so the instance serves no /status "
                          f"(set it, or give --url)", EXIT_USAGE)
    try:
        host, port = split_host_port(listen)
    except (UrlError, ValueError) as exc:
        raise StatusError(f"{path}: [metrics] listen = {listen!r}: {exc}", EXIT_USAGE) from None
    if port is None:
        raise StatusError(f"{path}: [metrics] listen = {listen!r} has no port", EXIT_USAGE)
    # A wildcard listener is asked on loopback.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}/status" if ":" in host else f"http://{host}:{port}/status"


def fetch_status(url: str, timeout: float = 5.0) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise StatusError(f"{url} answered HTTP {exc.code} {exc.reason}: is that gsync's "
                          f"[metrics] listen address?") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        reason = getattr(reason, "strerror", None) or str(reason)
        raise StatusError(f"cannot reach gsync at {url}: {reason}. Is it running "
                          f"(systemctl status gsync), and is this its [metrics] listen address?") from None
    try:
        status = json.loads(body)
    except ValueError:
        raise StatusError(f"{url} did not answer JSON: is that gsync's [metrics] listen address?") from None
    if not isinstance(status, dict) or not isinstance(status.get("relays"), list):
        raise StatusError(f"{url} answered JSON that is not gsync's status")
    return status


# -- the table ------------------------------------------------------------------------------

COLUMNS = (
    ("RELAY", "relay"),
    ("STATUS", "status"),
    ("HEALTH", "health"),
    ("SUBS", "subscriptions"),
    ("DELIVERED", "events_delivered"),
    ("QUEUED", "starts_queued"),
    ("LAST ERROR", "last_error"),
)
_RIGHT = {"subscriptions", "starts_queued", "events_delivered"}
# ``ngit_sync_relay_connected`` 2, 3 and 4: a live connection.
CONNECTED_STATUSES = ("syncing", "connected", "connected_historic_sync_failures")


def _cell(relay: dict, key: str) -> str:
    value = relay.get(key)
    if key == "relay":
        return str(value) + (" (bootstrap)" if relay.get("bootstrap") else "")
    if key == "health" and relay.get("parked"):
        hours = relay.get("parked_secs", 0) / 3600
        return f"{value} (parked {hours:.1f} h: {relay['parked']})"
    if key == "last_error":
        text = " ".join(str(value).split()) if value else "-"
        return text if len(text) <= MAX_ERROR_WIDTH else text[: MAX_ERROR_WIDTH - 1] + "…"
    return "-" if value is None else str(value)


def header(status: dict) -> str:
    relays = status.get("relays", [])
    connected = sum(1 for r in relays if r.get("status") in CONNECTED_STATUSES)
    own = "up" if status.get("own_relay_up") else "DOWN"
    ready = "ready" if status.get("ready") else "NOT READY (own relay not subscribed yet)"
    parts = [
        f"own relay {status.get('own_relay', '?')} {own}",
        ready,
        f"{status.get('repos', 0)} repos",
        f"delivery backlog {status.get('delivery_backlog', 0)}",
    ]
    if status.get("rejected"):
        parts.append(f"{status['rejected']} rejected")
    parts.append(f"{connected}/{len(relays)} relays connected")
    return ", ".join(parts)


def progress_lines(status: dict) -> list[str]:
    """The sync round's progress, one line (none from a gsync that does not report it)."""
    from ..sync.progress import progress_line

    progress = status.get("progress")
    return [progress_line(progress)] if isinstance(progress, dict) else []


def render(status: dict) -> str:
    lines = [header(status), *state_warning(status), *progress_lines(status), ""]
    relays = status.get("relays", [])
    if not relays:
        lines.append("no remote relays tracked yet")
        return "\n".join(lines) + "\n"
    rows = [[title for title, _ in COLUMNS]]
    rows += [[_cell(r, key) for _, key in COLUMNS] for r in relays]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        cells = []
        for i, (_, key) in enumerate(COLUMNS):
            last = i == len(COLUMNS) - 1
            if key in _RIGHT:
                cells.append(row[i].rjust(widths[i]))
            else:
                cells.append(row[i] if last else row[i].ljust(widths[i]))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def state_warning(status: dict) -> list[str]:
    """One line while the state is not being saved (what a restart would lose grows)."""
    state = status.get("state") or {}
    if not state.get("save_error"):
        return []
    ago = state.get("saved_secs_ago")
    if not isinstance(ago, int):
        since = "since the start"
    else:
        since = f"for {ago // 60} min {ago % 60} s" if ago >= 60 else f"for {ago} s"
    return [f"STATE NOT SAVED {since}: {state.get('path', 'state_dir')}: {state['save_error']} "
            f"(free space or fix permissions there; the log has state_save_failed)"]


if __name__ == "__main__":
    sys.exit(main())
