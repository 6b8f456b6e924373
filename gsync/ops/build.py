"""What this gsync is: its package version (``gsync --version``, the ``started`` log line,
the ``gsync_build_info`` metric)."""
from __future__ import annotations

import importlib.metadata
import platform


def version() -> str:
    try:
        return importlib.metadata.version("gsync")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def python_version() -> str:
    return platform.python_version()
