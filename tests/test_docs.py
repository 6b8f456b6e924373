"""The log and metric references (docs/logs.md, docs/metrics.md) against the code.

Pure file scanning: the logger calls and metric registrations are read from gsync/'s source
with ``ast`` (nothing is imported or run), the references' table rows from the markdown.
Each event gsync emits, and each metric it registers, has one row, with the levels, fields,
type and labels the code gives it; a row naming what the code no longer emits fails too.

A log call is a ``.debug/.info/.warning/.error/.exception/.critical`` call on a receiver
whose name holds ``log`` (``log``, ``self.log``, ``self._log``): its first argument is the
event's name, a string literal; its keyword arguments are the fields.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "gsync"
LOGS_DOC = ROOT / "docs" / "logs.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"

LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}
METRIC_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
                "Summary": "summary", "Info": "info", "Enum": "stateset"}
# What prometheus_client's ProcessCollector serves (on Linux, from /proc).
PROCESS_METRICS = {
    "process_virtual_memory_bytes": ("gauge", ()),
    "process_resident_memory_bytes": ("gauge", ()),
    "process_start_time_seconds": ("gauge", ()),
    "process_cpu_seconds_total": ("counter", ()),
    "process_open_fds": ("gauge", ()),
    "process_max_fds": ("gauge", ()),
}
ROW = re.compile(r"^\|\s*`([a-z][a-z0-9_]*)`\s*\|")


@functools.lru_cache(maxsize=4)
def _modules(root: Path = SOURCE) -> tuple:
    return tuple((path, ast.parse(path.read_text(), filename=str(path)))
                 for path in sorted(root.rglob("*.py")))


def _where(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _receiver(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


@functools.lru_cache(maxsize=4)
def emitted_log_events(root: Path = SOURCE) -> tuple[dict[str, tuple[set, set]], list[str]]:
    """event -> (levels, fields) over every log call in ``root``; and the calls whose event
    is not a string literal (which no reference could check). Scanned once per run (do
    not change what it returns)."""
    events: dict[str, tuple[set, set]] = {}
    unnamed = []
    for path, tree in _modules(root):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS and "log" in _receiver(node.func.value).lower()):
                continue
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                unnamed.append(f"{_where(path)}:{node.lineno}")
                continue
            levels, fields = events.setdefault(first.value, (set(), set()))
            levels.add("error" if node.func.attr == "exception" else node.func.attr)
            for keyword in node.keywords:
                if keyword.arg is None:
                    unnamed.append(f"{_where(path)}:{node.lineno} (**fields)")
                else:
                    fields.add(keyword.arg)
    return events, unnamed


@functools.lru_cache(maxsize=4)
def registered_metrics(root: Path = SOURCE) -> dict[str, tuple[str, tuple]]:
    """metric name as exposed -> (type, labels), over every prometheus_client registration."""
    metrics: dict[str, tuple[str, tuple]] = {}
    for _, tree in _modules(root):
        imported = {alias.asname or alias.name: alias.name
                    for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
                    for alias in node.names}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) and \
                _receiver(node.func.value) == "prometheus_client" else \
                imported.get(getattr(node.func, "id", ""))
            if name == "ProcessCollector":
                metrics.update(PROCESS_METRICS)
            if name not in METRIC_TYPES:
                continue
            assert node.args and isinstance(node.args[0], ast.Constant), \
                f"a metric named by a literal, please: {ast.unparse(node)[:80]}"
            labels = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg == "labelnames"), None)
            label_names = tuple(ast.literal_eval(labels)) if labels is not None else ()
            exposed = node.args[0].value
            if name == "Counter" and not exposed.endswith("_total"):
                exposed += "_total"
            metrics[exposed] = (METRIC_TYPES[name], label_names)
    return metrics


def documented_rows(doc: Path) -> tuple[dict[str, list[str]], list[str]]:
    """name -> its row's cells, for every table row whose first cell is one `name`; and
    the names with more than one row."""
    rows: dict[str, list[str]] = {}
    twice = []
    for line in doc.read_text().splitlines():
        match = ROW.match(line)
        if not match:
            continue
        if match.group(1) in rows:
            twice.append(match.group(1))
        rows[match.group(1)] = [cell.strip() for cell in line.strip().strip("|").split("|")]
    return rows, twice


def _names(cell: str) -> set[str]:
    return {part.strip().strip("`") for part in cell.split(",")} - {"", "—", "-"}


def _compare(kind: str, in_code: set[str], in_docs: set[str]) -> list[str]:
    problems = [f"{kind} {name!r} is emitted but not documented" for name in sorted(in_code - in_docs)]
    problems += [f"{kind} {name!r} is documented but gsync no longer has it"
                 for name in sorted(in_docs - in_code)]
    return problems


def log_problems(source: Path = SOURCE, doc: Path = LOGS_DOC) -> list[str]:
    events, unnamed = emitted_log_events(source)
    rows, twice = documented_rows(doc)
    problems = [f"log call with no literal event name or fields, at {where}" for where in unnamed]
    problems += [f"log event {name!r} has more than one row" for name in twice]
    problems += _compare("log event", set(events), set(rows))
    for name in sorted(set(events) & set(rows)):
        levels, fields = events[name]
        cells = rows[name]
        if len(cells) < 4:
            problems.append(f"log event {name!r}: its row needs event | level | fields | when")
            continue
        if _names(cells[1]) != levels:
            problems.append(f"log event {name!r}: levels {sorted(levels)} in the code, "
                            f"{sorted(_names(cells[1]))} in {doc.name}")
        if _names(cells[2]) != fields:
            problems.append(f"log event {name!r}: fields {sorted(fields)} in the code, "
                            f"{sorted(_names(cells[2]))} in {doc.name}")
    return problems


def metric_problems(source: Path = SOURCE, doc: Path = METRICS_DOC) -> list[str]:
    metrics = registered_metrics(source)
    rows, twice = documented_rows(doc)
    problems = [f"metric {name!r} has more than one row" for name in twice]
    problems += _compare("metric", set(metrics), set(rows))
    for name in sorted(set(metrics) & set(rows)):
        kind, labels = metrics[name]
        cells = rows[name]
        if len(cells) < 4:
            problems.append(f"metric {name!r}: its row needs metric | type | labels | meaning")
            continue
        if cells[1] != kind:
            problems.append(f"metric {name!r}: a {kind} in the code, {cells[1]!r} in {doc.name}")
        if _names(cells[2]) != set(labels):
            problems.append(f"metric {name!r}: labels {sorted(labels)} in the code, "
                            f"{sorted(_names(cells[2]))} in {doc.name}")
    return problems


def test_every_log_event_is_documented_once_as_emitted():
    events, _ = emitted_log_events()
    assert len(events) > 80, "the scan for logger calls finds too little: has the logging changed?"
    assert log_problems() == []


def test_every_metric_is_documented_once_as_registered():
    metrics = registered_metrics()
    assert len(metrics) > 40, "the scan for metric registrations finds too little"
    assert "process_resident_memory_bytes" in metrics
    assert metric_problems() == []


# -- the checks have teeth: each kind of drift, made on a copy, is reported ----------------

def _edited(tmp_path: Path, doc: Path, old: str, new: str) -> Path:
    text = doc.read_text()
    assert old in text
    copy = tmp_path / doc.name
    copy.write_text(text.replace(old, new, 1))
    return copy


def _row(doc: Path, name: str) -> str:
    return next(line for line in doc.read_text().splitlines() if line.startswith(f"| `{name}` |"))


def test_a_missing_or_twice_written_or_stale_log_row_is_reported(tmp_path):
    row = _row(LOGS_DOC, "relay_parked")
    assert log_problems(doc=_edited(tmp_path, LOGS_DOC, row + "\n", "")) == [
        "log event 'relay_parked' is emitted but not documented"]
    assert log_problems(doc=_edited(tmp_path, LOGS_DOC, row, row + "\n" + row)) == [
        "log event 'relay_parked' has more than one row"]
    stale = row.replace("`relay_parked`", "`relay_parked_long_ago`")
    assert log_problems(doc=_edited(tmp_path, LOGS_DOC, row, row + "\n" + stale)) == [
        "log event 'relay_parked_long_ago' is documented but gsync no longer has it"]
    assert log_problems(doc=_edited(tmp_path, LOGS_DOC, row, row.replace("park_secs", "parked_for"))) == [
        "log event 'relay_parked': fields ['kind', 'park_secs', 'reason', 'relay'] in the code, "
        "['kind', 'parked_for', 'reason', 'relay'] in logs.md"]


def test_a_new_log_call_is_reported(tmp_path):
    source = tmp_path / "gsync"
    source.mkdir()
    (source / "new.py").write_text(
        'log.info("relay_parked", relay=1, reason=2, kind=3, park_secs=4)\n'
        'log.warning("brand_new_event", relay=1)\n'
        'self._log.debug(name)\n')
    problems = log_problems(source=source)
    assert f"log call with no literal event name or fields, at {source / 'new.py'}:3" in problems
    assert "log event 'brand_new_event' is emitted but not documented" in problems
    assert "log event 'relay_parked': levels ['info'] in the code, ['warning'] in logs.md" in problems


def test_a_missing_or_mistyped_metric_row_is_reported(tmp_path):
    row = _row(METRICS_DOC, "gsync_starts_queued")
    assert metric_problems(doc=_edited(tmp_path, METRICS_DOC, row + "\n", "")) == [
        "metric 'gsync_starts_queued' is emitted but not documented"]
    assert metric_problems(doc=_edited(tmp_path, METRICS_DOC, row, row.replace("| gauge |", "| counter |"))) == [
        "metric 'gsync_starts_queued': a gauge in the code, 'counter' in metrics.md"]
    process = _row(METRICS_DOC, "process_open_fds")
    assert metric_problems(doc=_edited(tmp_path, METRICS_DOC, process + "\n", "")) == [
        "metric 'process_open_fds' is emitted but not documented"]


# -- links between the README and docs/ ----------------------------------------------------

def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of ``doc``: lower case, punctuation dropped,
    spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in doc.read_text().splitlines() if line.startswith("#")}


def test_links_in_the_readme_and_docs_lead_somewhere():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []
