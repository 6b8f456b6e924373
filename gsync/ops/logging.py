"""Structured logs: one JSON object per line on stdout (journald), or a console view.

``configure_logging`` may be called again at any time (SIGHUP reloads the config): loggers
are not cached, so every logger — including module-level ones made before the first call —
follows the newest level and format (a logger made with ``.bind()`` keeps the configuration
of the moment it was bound: bind per message or re-bind after a reload). Records from libraries that use stdlib ``logging``
(requests, urllib3) go through the same renderer, so stdout stays one JSON object a line.
"""
from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("json", "console")

class _NamedPrintLogger(structlog.PrintLogger):
    def __init__(self, file: TextIO, name: str | None):
        super().__init__(file)
        self.name = name


def _add_logger_name(logger, method_name, event_dict):
    name = getattr(logger, "name", None)
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


_SHARED_PROCESSORS = (
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
)


# Frame locals stay out of tracebacks: they can hold the secret key or event contents.
_JSON_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def _renderer(fmt: str):
    if fmt == "console":
        return structlog.dev.ConsoleRenderer(colors=False)
    return structlog.processors.JSONRenderer(sort_keys=False)


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Send logs at ``level`` and above to ``stream`` (stdout by default) as ``fmt``."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    stream = stream if stream is not None else sys.stdout
    renderer = _renderer(fmt)
    structlog.configure(
        processors=[
            _add_logger_name,
            *_SHARED_PROCESSORS,
            structlog.processors.StackInfoRenderer(),
            _JSON_TRACEBACKS if fmt == "json" else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=lambda name=None, *_: _NamedPrintLogger(stream, name),
        cache_logger_on_first_use=False,
    )
    _route_stdlib_logging(LEVELS[level], renderer, stream)


def _route_stdlib_logging(level: int, renderer, stream: TextIO) -> None:
    handler = logging.StreamHandler(stream)
    handler.set_name("gsync")
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *_SHARED_PROCESSORS],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "gsync"]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries chatter at debug (every HTTP connection); their warnings are what matter.
    root.setLevel(max(level, logging.WARNING))


def get_logger(name: str | None = None, **context):
    """A logger whose lines carry ``logger=name``; it follows every later reconfiguration.

    (Binding the name as context would freeze the logger to the configuration of the moment.)
    """
    args = (name,) if name else ()
    return _Logger(structlog.get_logger(*args, **context))


class _Logger:
    """structlog's lazy proxy, its logger kept while the configuration is the same: the
    proxy assembles a new logger at every call (4.8 us, where a kept one takes 0.3 us to
    drop a line below the level), and most calls are dropped (the simulator's manager
    makes tens of thousands). ``configure`` sets a new wrapper class (the level), logger
    factory (the stream) or processor list: any of them changed, the next call assembles
    the logger again. (A processor list changed in place, as ``structlog.testing``
    does, is the same list the kept logger reads; the context class stays dict.)"""

    __slots__ = ("_proxy", "_logger", "_wrapper", "_factory", "_processors")

    def __init__(self, proxy):
        self._proxy = proxy
        self._logger = self._wrapper = self._factory = self._processors = None

    def bind(self, **values):
        return self._proxy.bind(**values)

    def __getattr__(self, name: str):
        config = structlog.get_config()  # public; the same objects configure() set
        wrapper, factory, processors = config["wrapper_class"], config["logger_factory"], config["processors"]
        if self._wrapper is not wrapper or self._factory is not factory or self._processors is not processors:
            self._logger = self._proxy.bind()
            self._wrapper, self._factory, self._processors = wrapper, factory, processors
        return getattr(self._logger, name)
