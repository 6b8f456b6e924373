"""Structured logs: JSON lines on the stream, level filtering, reconfiguration at runtime."""
import io
import json
import logging
from datetime import datetime

import pytest
import structlog

from gsync.ops.logging import configure_logging, get_logger

# A module-level logger made before any configuration, as gsync's modules make theirs.
early_log = get_logger("gsync.early")


@pytest.fixture(autouse=True)
def restore_structlog():
    yield
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "gsync"]:
        root.removeHandler(handler)


def json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_format_writes_one_object_per_line():
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    log = get_logger("gsync.test")
    log.info("relay_connected", relay="wss://relay.example.com", batch_id=7)
    log.warning("event_dropped", reason="bad_signature", text="line\nbreak")
    first, second = json_lines(out)
    assert first["event"] == "relay_connected"
    assert first["level"] == "info"
    assert first["relay"] == "wss://relay.example.com" and first["batch_id"] == 7
    assert first["logger"] == "gsync.test"
    assert datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00")).tzinfo is not None
    assert (second["level"], second["text"]) == ("warning", "line\nbreak")


def test_unserialisable_values_and_exceptions_still_make_json():
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    secret_local = "do-not-log-me"  # noqa: F841 — tracebacks must not carry frame locals
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("gsync.test").exception("handler_crashed", obj=object())
    [line] = json_lines(out)
    assert line["event"] == "handler_crashed" and "object" in line["obj"]
    assert "RuntimeError" in json.dumps(line["exception"])
    assert "do-not-log-me" not in out.getvalue()


def test_level_filters_lower_levels():
    out = io.StringIO()
    configure_logging("warning", "json", stream=out)
    log = get_logger("gsync.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [line["event"] for line in json_lines(out)] == ["w", "e"]


def test_reconfiguring_changes_level_of_existing_loggers():
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    early_log.debug("hidden")
    configure_logging("debug", "json", stream=out)  # what SIGHUP does
    early_log.debug("shown")
    configure_logging("error", "json", stream=out)
    early_log.warning("hidden again")
    assert [line["event"] for line in json_lines(out)] == ["shown"]


def test_console_format_is_human_readable():
    out = io.StringIO()
    configure_logging("info", "console", stream=out)
    get_logger("gsync.test").info("relay_connected", relay="wss://r.example.com")
    text = out.getvalue()
    assert "relay_connected" in text and "relay=wss://r.example.com" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_stdlib_library_logs_become_json_lines_too():
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    logging.getLogger("urllib3.connectionpool").warning("retrying %s", "x")
    logging.getLogger("urllib3.connectionpool").info("chatter")
    [line] = json_lines(out)
    assert (line["event"], line["level"], line["logger"]) == ("retrying x", "warning", "urllib3.connectionpool")


@pytest.mark.parametrize("level, fmt", [("loud", "json"), ("info", "xml")])
def test_bad_level_or_format_is_refused(level, fmt):
    with pytest.raises(ValueError):
        configure_logging(level, fmt)


def _documented_log_events() -> set[str]:
    import pathlib
    import re

    section = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "logs.md").read_text()
    return {name for line in section.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])}


def _source() -> str:
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "gsync"
    return "\n".join(p.read_text() for p in root.rglob("*.py"))


def test_every_event_docs_logs_lists_is_emitted():
    source = _source()
    assert sorted(n for n in _documented_log_events() if f'"{n}"' not in source) == []


def test_every_warning_and_error_gsync_emits_is_in_docs_logs():
    import re

    emitted = set(re.findall(r'\.(?:warning|error|exception)\(\s*"([a-z0-9_]+)"', _source()))
    assert sorted(emitted - _documented_log_events()) == []
