"""The INI file → one typed, frozen ``Config`` (SPEC §7).

``load_config`` checks everything before anything starts and reports every error at once,
each with its file, section, key and value, so an operator fixes a file in one pass. The
secret key is read here but never shown: not in errors, ``repr`` or ``describe()``.
"""
from __future__ import annotations

import configparser
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .. import constants
from ..protocol.urls import (
    AddressPolicy,
    UrlError,
    normalize_domain,
    normalize_relay_url,
    split_host_port,
)
from ..sync.shard import Shard

DEFAULT_CONFIG_PATH = "/etc/gsync/gsync.ini"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "console")

_SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_HEX64 = re.compile(r"[0-9a-fA-F]{64}\Z")
_MAX_KEY_FILE_BYTES = 4096
CREDENTIALS_PREFIX = "$CREDENTIALS_DIRECTORY/"  # [auth] key_file from systemd's LoadCredential=


@dataclass(frozen=True)
class ServiceConfig:
    own_relay: str
    domains: tuple[str, ...]
    state_dir: str = "/var/lib/gsync"


@dataclass(frozen=True)
class SyncConfig:
    bootstrap_relays: tuple[str, ...] = ()
    batch_window_ms: int = constants.BATCH_WINDOW_MS
    base_backoff_secs: float = constants.BASE_BACKOFF_SECS
    max_backoff_secs: float = constants.MAX_BACKOFF_SECS
    negentropy: bool = True
    handshake_workers: int = constants.HANDSHAKE_WORKERS
    recovery_base_secs: float = constants.RECOVERY_BASE_SECS
    background_start_interval_ms: int = int(constants.PROACTIVE_GATE_SECS * 1000)
    delivery_max_backlog: int = constants.DELIVERY_MAX_BACKLOG


@dataclass(frozen=True)
class NetworkConfig:
    allow_private_addresses: AddressPolicy = field(default_factory=AddressPolicy)
    max_relays: int = constants.MAX_RELAYS_TOTAL


@dataclass(frozen=True)
class ClusterConfig:
    shard: Shard = field(default_factory=Shard)


@dataclass(frozen=True)
class AuthConfig:
    key_file: str | None = None
    secret_key: str | None = field(default=None, repr=False)  # 64 lower-case hex


@dataclass(frozen=True)
class MetricsConfig:
    listen: tuple[str, int] | None = ("127.0.0.1", 9464)  # None: no metrics endpoint


@dataclass(frozen=True)
class LogConfig:
    level: str = "info"
    format: str = "json"


@dataclass(frozen=True)
class Config:
    service: ServiceConfig
    sync: SyncConfig = field(default_factory=SyncConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    path: str = ""

    def sections(self) -> dict[str, dict]:
        """The effective configuration, section → key → value as the INI spells it."""
        listen = self.metrics.listen
        return {
            "service": {
                "own_relay": self.service.own_relay,
                "domain": ", ".join(self.service.domains),
                "state_dir": self.service.state_dir,
            },
            "sync": {
                "bootstrap_relays": ", ".join(self.sync.bootstrap_relays),
                "batch_window_ms": self.sync.batch_window_ms,
                "base_backoff_secs": _format_number(self.sync.base_backoff_secs),
                "max_backoff_secs": _format_number(self.sync.max_backoff_secs),
                "negentropy": str(self.sync.negentropy).lower(),
                "handshake_workers": self.sync.handshake_workers,
                "recovery_base_secs": _format_number(self.sync.recovery_base_secs),
                "background_start_interval_ms": self.sync.background_start_interval_ms,
                "delivery_max_backlog": self.sync.delivery_max_backlog,
            },
            "network": {
                "allow_private_addresses": str(self.network.allow_private_addresses),
                "max_relays": self.network.max_relays,
            },
            "cluster": {"shard": str(self.cluster.shard)},
            "auth": {"key_file": self.auth.key_file or ""},
            "metrics": {"listen": _format_listen(listen) if listen else ""},
            "log": {"level": self.log.level, "format": self.log.format},
        }

    def describe(self) -> str:
        """The effective configuration as INI text, defaults filled in, without the secret."""
        lines = []
        for name, keys in self.sections().items():
            lines.append(f"[{name}]")
            lines += [f"{key} = {value}".rstrip() for key, value in keys.items()]
            lines.append("")
        return "\n".join(lines)


# Keys a SIGHUP applies without a restart (runner.reload_config); any other change waits for one.
RELOADABLE_KEYS = frozenset({"log.level", "log.format", "sync.bootstrap_relays"})


def changed_keys(old: Config, new: Config) -> list[str]:
    """``section.key`` of every value that differs between two configurations (the key
    file's content too, as ``auth.key_file``)."""
    before, after = old.sections(), new.sections()
    changed = [f"{section}.{key}" for section, keys in after.items() for key, value in keys.items()
               if before.get(section, {}).get(key) != value]
    if old.auth.secret_key != new.auth.secret_key and "auth.key_file" not in changed:
        changed.append("auth.key_file")
    return changed


# -- errors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigError:
    file: str
    message: str
    section: str | None = None
    key: str | None = None
    value: str | None = None

    def __str__(self) -> str:
        """One line, starting with the file: names with control characters are quoted, a
        message of several lines (configparser's) is joined."""
        where = ""
        if self.section is not None:
            where = f"[{_shown(self.section)}]"
            if self.key is not None:
                where += f" {_shown(self.key)}"
                if self.value is not None:
                    where += f" = {self.value!r}"
            where += ": "
        message = "; ".join(line.strip() for line in self.message.splitlines() if line.strip())
        return f"{self.file}: {where}{_shown(message) if message else message}"


def _shown(text: str) -> str:
    """``text`` as it is if it prints on one line, else its Python repr (quoted, escaped)."""
    return text if text.isprintable() else repr(text)


class ConfigErrors(Exception):
    """Every problem found in one config file, listed in ``errors``."""

    def __init__(self, errors: list[ConfigError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


# -- value parsers: each returns the typed value or raises ValueError with the reason ---


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError("not a whole number") from None
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise ValueError("must be a positive number of seconds")
    return value


def _bool(text: str) -> bool:
    states = configparser.ConfigParser.BOOLEAN_STATES
    if text.lower() not in states:
        raise ValueError("not a boolean (true/false, yes/no, on/off, 1/0)")
    return states[text.lower()]


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.lower()

    return parse


def _domains(text: str) -> tuple[str, ...]:
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise ValueError("at least one public host[:port] is required")
    return tuple(dict.fromkeys(normalize_domain(e) for e in entries))


def _non_empty(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def _listen(text: str) -> tuple[str, int] | None:
    if not text:
        return None
    host, port = split_host_port(text)
    if port is None:
        raise ValueError("needs host:port, e.g. 127.0.0.1:9464")
    return host, port


def _format_listen(listen: tuple[str, int]) -> str:
    host, port = listen
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _format_number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


# -- the schema: section → key → (parser, default text; None = required) ----------------

_REQUIRED = None
_SCHEMA: dict[str, dict[str, tuple[Callable[[str], object], str | None]]] = {
    "service": {
        "own_relay": (normalize_relay_url, _REQUIRED),  # UrlError is a ValueError
        "domain": (_domains, _REQUIRED),
        "state_dir": (_non_empty, "/var/lib/gsync"),
    },
    "sync": {
        "bootstrap_relays": (str, ""),  # split per URL below, so each bad URL is named
        "batch_window_ms": (_int_in(0, 600_000), str(constants.BATCH_WINDOW_MS)),
        "base_backoff_secs": (_positive_seconds, _format_number(constants.BASE_BACKOFF_SECS)),
        "max_backoff_secs": (_positive_seconds, _format_number(constants.MAX_BACKOFF_SECS)),
        "negentropy": (_bool, "true"),
        "handshake_workers": (_int_in(1, 64), str(constants.HANDSHAKE_WORKERS)),
        "recovery_base_secs": (_positive_seconds, _format_number(constants.RECOVERY_BASE_SECS)),
        "background_start_interval_ms": (
            _int_in(0, 60_000), str(int(constants.PROACTIVE_GATE_SECS * 1000))
        ),
        "delivery_max_backlog": (_int_in(100, 10_000_000), str(constants.DELIVERY_MAX_BACKLOG)),
    },
    "network": {
        "allow_private_addresses": (AddressPolicy.parse, "false"),
        "max_relays": (_int_in(1, 100_000), str(constants.MAX_RELAYS_TOTAL)),
    },
    "cluster": {"shard": (Shard.parse, "0/1")},
    "auth": {"key_file": (str, "")},
    "metrics": {"listen": (_listen, "127.0.0.1:9464")},
    "log": {"level": (_one_of(LOG_LEVELS), "info"), "format": (_one_of(LOG_FORMATS), "json")},
}


class _Reader:
    """Reads one file against ``_SCHEMA``, collecting errors instead of stopping at one."""

    def __init__(self, path: str):
        self.path = path
        self.errors: list[ConfigError] = []

    def error(self, message: str, section=None, key=None, value=None) -> None:
        self.errors.append(ConfigError(self.path, message, section, key, value))

    def read(self) -> dict[str, dict[str, object]]:
        parser = configparser.ConfigParser(
            interpolation=None,  # a literal % in a value must not be an error
            default_section="\0none",  # a [DEFAULT] section is reported, not inherited
            strict=True,
        )
        try:
            with open(self.path, encoding="utf-8") as f:
                parser.read_file(f)
        except (OSError, UnicodeDecodeError) as exc:
            self.error(f"cannot read file: {exc}")
            return {}
        except configparser.Error as exc:
            self.error(f"not a valid INI file: {exc}")
            return {}
        for section in parser.sections():
            if section not in _SCHEMA:
                self.error(f"unknown section (known: {', '.join(_SCHEMA)})", section)
                continue
            for key in parser[section]:
                if key not in _SCHEMA[section]:
                    self.error(
                        f"unknown key (known: {', '.join(_SCHEMA[section])})",
                        section, key, parser[section][key],
                    )
        return {name: self._section(parser, name, keys) for name, keys in _SCHEMA.items()}

    def _section(self, parser, name, keys) -> dict[str, object]:
        values = {}
        for key, (parse, default) in keys.items():
            given = parser.get(name, key, fallback=None)
            text = (given if given is not None else default or "").strip()
            if given is None and default is _REQUIRED:
                self.error("missing required key", name, key)
                continue
            try:
                values[key] = parse(text)
            except ValueError as exc:
                self.error(str(exc), name, key, text)
        return values

    def bootstrap_relays(self, text: str) -> tuple[str, ...]:
        urls = []
        for entry in re.split(r"[\s,]+", text.strip()):
            if not entry:
                continue
            try:
                urls.append(normalize_relay_url(entry))
            except UrlError as exc:
                self.error(str(exc), "sync", "bootstrap_relays", entry)
        return tuple(dict.fromkeys(urls))

    def secret_key(self, key_file: str) -> str | None:
        """The key in ``key_file``. ``$CREDENTIALS_DIRECTORY/NAME`` reads the credential
        systemd passed with ``LoadCredential=NAME:…`` (DynamicUser= has no fixed user to own
        a key file; systemd hands the service a private copy)."""
        if not key_file:
            return None
        if key_file.startswith(CREDENTIALS_PREFIX):
            directory = os.environ.get("CREDENTIALS_DIRECTORY")
            if not directory:
                self.error("$CREDENTIALS_DIRECTORY is not set: run under systemd with LoadCredential=",
                           "auth", "key_file", key_file)
                return None
            key_file = os.path.join(directory, key_file[len(CREDENTIALS_PREFIX):])
        try:
            with open(key_file, "rb") as f:
                data = f.read(_MAX_KEY_FILE_BYTES + 1)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            self.error(f"cannot read key file: {getattr(exc, 'strerror', None) or exc}",
                       "auth", "key_file", key_file)
            return None
        # The message never includes the file's contents: they may be a real key.
        text = data.decode("ascii", errors="replace").strip()
        if len(data) > _MAX_KEY_FILE_BYTES or not _HEX64.match(text):
            self.error("key file must hold one 64-hex-digit secret key", "auth", "key_file", key_file)
            return None
        if not 0 < int(text, 16) < _SECP256K1_ORDER:
            self.error("key file holds a value that is not a valid secp256k1 secret key",
                       "auth", "key_file", key_file)
            return None
        return text.lower()


def _schema_order(error: ConfigError) -> tuple[int, int]:
    """File-level errors first, then by section and key as the schema (and conf/gsync.ini) list them."""
    if error.section is None:
        return (-1, 0)
    sections = list(_SCHEMA)
    if error.section not in _SCHEMA:
        return (len(sections), 0)
    keys = list(_SCHEMA[error.section])
    return (sections.index(error.section), keys.index(error.key) if error.key in keys else len(keys))


def load_config(path: str) -> Config:
    """The checked configuration in ``path``; ``ConfigErrors`` naming every problem if any."""
    reader = _Reader(path)
    v = reader.read()
    if reader.errors and not v:
        raise ConfigErrors(reader.errors)
    sync, net, auth = v["sync"], v["network"], v["auth"]
    bootstrap = reader.bootstrap_relays(sync.pop("bootstrap_relays", ""))
    key_file = auth.get("key_file", "")
    secret_key = reader.secret_key(key_file)
    base, top = sync.get("base_backoff_secs"), sync.get("max_backoff_secs")
    if base is not None and top is not None and top < base:
        reader.error(f"must be at least base_backoff_secs ({_format_number(base)})",
                     "sync", "max_backoff_secs", _format_number(top))
    if reader.errors:
        raise ConfigErrors(sorted(reader.errors, key=_schema_order))
    service = v["service"]
    return Config(
        service=ServiceConfig(service["own_relay"], service["domain"], service["state_dir"]),
        sync=SyncConfig(bootstrap_relays=bootstrap, **sync),
        network=NetworkConfig(**net),
        cluster=ClusterConfig(**v["cluster"]),
        auth=AuthConfig(key_file=key_file or None, secret_key=secret_key),
        metrics=MetricsConfig(**v["metrics"]),
        log=LogConfig(**v["log"]),
        path=path,
    )


def as_shard(config: Config, text: str) -> Config:
    """``config`` for instance ``text`` (``i-of-N`` or ``i/N``) of several run from one file
    (``gsync run --shard``, the ``gsync@i-of-N`` template unit): shard i of N, its state in
    ``state_dir/i-of-N`` and its metrics on the configured port + i, so N instances beside
    one another share the file and nothing else. Raises ``ValueError`` for bad text."""
    try:
        shard = Shard.parse(text, sep="-of-")
    except ValueError as exc:
        raise ValueError(f"--shard {text}: {exc}") from None
    listen = config.metrics.listen
    if listen is not None:
        if listen[1] + shard.index > 65535:
            raise ValueError(f"--shard {text}: metrics port {listen[1]} + {shard.index} is past 65535")
        listen = (listen[0], listen[1] + shard.index)
    state_dir = os.path.join(config.service.state_dir, shard.instance_name)
    return replace(
        config,
        service=replace(config.service, state_dir=state_dir),
        cluster=replace(config.cluster, shard=shard),
        metrics=replace(config.metrics, listen=listen),
    )


def with_metrics_listen(config: Config, text: str) -> Config:
    """``config`` with ``[metrics] listen`` replaced (``gsync run --metrics-listen``: a
    container whose port is fixed, whatever its shard). Raises ``ValueError``."""
    return replace(config, metrics=replace(config.metrics, listen=_listen(text)))
