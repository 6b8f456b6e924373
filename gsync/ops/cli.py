"""The ``gsync`` command: run, check-config, status, demo (SPEC §7).

Commands that open sockets (``run``, ``demo``) need gevent's monkey patching before anything
imports ``socket`` or ``ssl`` — structlog and http.client both do — so this module imports
nothing at the top but argparse, and patches before importing the rest. ``status`` and
``demo`` own their options: they get the remaining command-line arguments as a list.
"""
from __future__ import annotations

import argparse
import sys

from .exits import EXIT_BAD_CONFIG, EXIT_FAILURE, EXIT_OK

DEFAULT_CONFIG_PATH = "/etc/gsync/gsync.ini"
_NETWORK_COMMANDS = ("run", "demo")
_DELEGATED_COMMANDS = ("status", "demo")


def _parser() -> argparse.ArgumentParser:
    from .build import version

    parser = argparse.ArgumentParser(prog="gsync", description="GRASP-02 proactive sync worker")
    parser.add_argument("--version", action="version", version=f"gsync {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("run", "sync the own relay until stopped"),
        ("check-config", "check a config file and print the effective configuration"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="FILE",
                             help=f"INI file (default {DEFAULT_CONFIG_PATH})")
        command.add_argument("--shard", metavar="i-of-N",
                             help="run as shard i of N from a file shared by all of them: "
                                  "[cluster] shard i/N, state in state_dir/i-of-N, metrics on "
                                  "the configured port + i")
        command.add_argument("--metrics-listen", metavar="HOST:PORT",
                             help="[metrics] listen, whatever the file or --shard say")
    # No help of their own: ``gsync status --help`` reaches the status command's parser.
    commands.add_parser("status", help="show the relays of the running instance", add_help=False)
    commands.add_parser("demo", help="sync a self-contained sandbox and show progress", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in _NETWORK_COMMANDS:
        patch_for_gevent()
    if args.command in _DELEGATED_COMMANDS:
        return _delegate(args.command, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    overrides = {"shard": args.shard, "metrics_listen": args.metrics_listen}
    if args.command == "check-config":
        return _check_config(args.config, overrides)
    return _run(args.config, overrides)


def patch_for_gevent() -> None:
    """gevent's monkey patching, once. gevent looks up its plugins' entry points for each of
    the 25 modules it patches, and each lookup reads every installed package's metadata
    (0.1 s of CPU a start on a machine with many packages): they are read once here."""
    from importlib import metadata

    from gevent import monkey

    if monkey.is_module_patched("socket"):
        return
    every = metadata.entry_points()
    lookup, metadata.entry_points = metadata.entry_points, lambda **select: every.select(**select)
    try:
        monkey.patch_all()
    finally:
        metadata.entry_points = lookup


def _load(path: str, overrides: dict | None = None):
    """The config at ``path`` with the command line's overrides, or None after printing
    every error to stderr."""
    from .config import ConfigErrors, as_shard, load_config, with_metrics_listen

    try:
        config = load_config(path)
    except ConfigErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return None
    overrides = overrides or {}
    try:
        if overrides.get("shard"):
            config = as_shard(config, overrides["shard"])
        if overrides.get("metrics_listen"):
            config = with_metrics_listen(config, overrides["metrics_listen"])
    except ValueError as exc:
        print(f"command line: {exc}", file=sys.stderr)
        return None
    return config


def _check_config(path: str, overrides: dict | None = None) -> int:
    config = _load(path, overrides)
    if config is None:
        return EXIT_BAD_CONFIG
    sys.stdout.write(config.describe())
    return EXIT_OK


def _run(path: str, overrides: dict | None = None) -> int:
    config = _load(path, overrides)
    if config is None:
        return EXIT_BAD_CONFIG
    from .logging import configure_logging

    configure_logging(config.log.level, config.log.format)
    try:
        from ..io.runner import run
    except ImportError as exc:
        print(f"gsync: cannot start the sync worker: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    result = run(config)
    return result if isinstance(result, int) else EXIT_OK


def _delegate(command: str, rest: list[str]) -> int:
    import importlib

    try:
        module = importlib.import_module(f"gsync.ops.{command}")
    except ImportError as exc:
        print(f"gsync {command}: not available: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    result = module.main(rest)
    return result if isinstance(result, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
