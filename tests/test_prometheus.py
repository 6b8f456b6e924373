"""The operator's kit (``contrib/``), checked with the real tools: the alert rules pass
``promtool check rules`` and their unit tests (``tests/promtool/gsync-rules.test.yml``: each
alert fires on a series that should fire it and stays quiet on a healthy one), and a real
Prometheus scraping a running gsync answers every query of the Grafana dashboard.

CI needs Debian's ``prometheus`` package (``promtool`` and the server): ``apt-get update &&
apt-get install -y --no-install-recommends prometheus``. Without it these tests are skipped.
Everything listens on loopback; Prometheus gets a temporary directory of its own.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request

import pytest

from . import factory as f
from .gsync_proc import ROOT
from .relays import free_port, publish, wait_until
from .scenario import alice, assert_arrives, carol, two_remote_history

RULES = os.path.join(ROOT, "contrib", "prometheus", "gsync-rules.yml")
RULE_TESTS = os.path.join(ROOT, "tests", "promtool", "gsync-rules.test.yml")
DASHBOARD = os.path.join(ROOT, "contrib", "grafana", "gsync.json")
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
INSTALL = "apt-get update && apt-get install -y --no-install-recommends prometheus"
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=f"no promtool ({INSTALL})")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason=f"no prometheus server ({INSTALL})")

# What Grafana puts in for the dashboard's variables when a panel asks Prometheus.
GRAFANA_VARIABLES = {"$instance": ".+", "$__rate_interval": "15s"}


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every query of every panel, variables as Grafana fills them."""
    with open(DASHBOARD) as fh:
        dashboard = json.load(fh)
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    return out


def test_dashboard_is_importable_and_uses_its_variables():
    with open(DASHBOARD) as fh:
        dashboard = json.load(fh)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["type"] == "query"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


def exported_metrics() -> dict[str, set[str]]:
    """Metric name (as scraped: counters with ``_total``) → its label names, from gsync's
    registry; the ``process_*`` ones come from its ProcessCollector."""
    from prometheus_client.metrics import MetricWrapperBase

    from gsync.ops import metrics

    out: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + ("_total" if value._type == "counter" else "")
            out[name] = set(value._labelnames)
    for family in metrics.REGISTRY.collect():
        if family.name.startswith("process_"):
            out[family.name + ("_total" if family.type == "counter" else "")] = set()
    return out


def test_dashboard_names_only_metrics_and_labels_gsync_exports():
    exported = exported_metrics()
    assert "process_resident_memory_bytes" in exported
    target_labels = {"instance", "job"}  # Prometheus adds them to every series it scrapes
    for title, expr in dashboard_queries():
        names = set(re.findall(r"\b((?:ngit_sync|gsync|process)_[a-z_]+)\b", expr))
        assert names or expr.startswith("up{"), (title, expr)
        unknown = names - set(exported)
        assert not unknown, f"{title}: {sorted(unknown)} not exported"
        for name, matchers in re.findall(r"\b([a-z_]+)\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*=~?", matchers):
                assert label in exported.get(name, set()) | target_labels, (title, name, label)
        # labels made in the query itself (count_values, label_replace) or had by a metric
        made = set(re.findall(r'count_values by \([^)]*\) \("(\w+)"', expr))
        have = set().union(*(exported[n] for n in names)) | target_labels | made
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
            for label in (x.strip() for x in grouping.split(",")):
                assert label in have, (title, label, expr)


def test_docs_document_every_metric_gsync_exports():
    """The registry's own view (tests/test_docs.py reads the source): docs/metrics.md has a
    row for every series family gsync serves, the process collector's included."""
    with open(os.path.join(ROOT, "docs", "metrics.md")) as fh:
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", fh.read(), re.MULTILINE))
    missing = set(exported_metrics()) - documented
    assert not missing, f"not in docs/metrics.md: {sorted(missing)}"


@needs_promtool
def test_promtool_checks_the_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 11 rules found" in result.stdout


@needs_promtool
def test_every_alert_has_a_firing_and_a_quiet_case():
    result = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # (no YAML parser among the test dependencies: the two files' shapes are plain enough)
    with open(RULES) as fh:
        alerts = set(re.findall(r"^\s*- alert: (\w+)$", fh.read(), flags=re.M))
    with open(RULE_TESTS) as fh:
        cases = re.findall(r"alertname: (\w+)\n\s*exp_alerts:( \[\])?", fh.read())
    assert len(alerts) == 11
    fired = {name for name, none in cases if not none}
    quiet = {name for name, none in cases if none}
    assert fired == alerts and quiet == alerts


def test_the_gauges_the_alerts_read_follow_gsync_and_the_own_relay(relay_factory, gsync_factory):
    """gsync_ready, gsync_own_relay_up (down while the own relay is, up once it is back),
    the delivery backlog's and the rejected index's bounds, the repositories synced."""
    own = relay_factory()
    remote = relay_factory()
    repo, on_a, _ = two_remote_history(own, remote, remote)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"delivery_max_backlog": "1234"}})
    wait_until(lambda: gsync.metric("gsync_ready") == 1, timeout=30, what="gsync_ready 1")
    assert gsync.metric("gsync_own_relay_up") == 1
    assert gsync.metric("gsync_delivery_backlog_limit") == 1234
    assert gsync.metric("gsync_rejected_index_limit") == 50_000
    assert gsync.metric("gsync_rejected_index_entries") == 0
    assert gsync.metric("gsync_background_start_interval_seconds") == pytest.approx(0.02)
    wait_until(lambda: gsync.metric("gsync_repositories") == 1, timeout=30, what="one repository")
    assert gsync.metric("process_resident_memory_bytes") > 10e6
    own.stop()
    wait_until(lambda: gsync.metric("gsync_own_relay_up") == 0, timeout=30, what="own relay down")
    own.start()
    wait_until(lambda: gsync.metric("gsync_own_relay_up") == 1, timeout=30, what="own relay up again")


class PrometheusServer:
    """A Prometheus on a free loopback port, scraping ``targets`` every second, with the
    alert rules loaded; its data in a temporary directory removed on stop."""

    def __init__(self, targets: list[str]):
        self.dir = tempfile.mkdtemp(prefix="gsync-prometheus-")
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [RULES],
            "scrape_configs": [{"job_name": "gsync", "static_configs": [{"targets": targets}]}],
        }
        self.config_path = os.path.join(self.dir, "prometheus.yml")
        with open(self.config_path, "w") as fh:
            json.dump(config, fh)  # JSON is YAML
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self.proc = None

    def start(self) -> PrometheusServer:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.config_path}",
             f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--web.console.templates=/nonexistent", "--web.console.libraries=/nonexistent"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir,
        )
        wait_until(self._ready, timeout=30, interval=0.2, what="prometheus ready")
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            with open(self.log_path) as fh:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{fh.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def prometheus_factory():
    started = []

    def start(targets):
        server = PrometheusServer(targets)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.mark.slow
@needs_prometheus
def test_every_dashboard_query_returns_data_from_prometheus_scraping_gsync(relay_factory, gsync_factory,
                                                                          prometheus_factory):
    """A small world like the demo's: two remotes share a repository's history, one of them
    refuses quote filters by policy (refusals, paused coverage), and the own relay refuses
    one author (rejected deliveries, the rejected index)."""
    own = relay_factory(reject={"authors": [carol.pubkey], "message": "not from carol"})
    a = relay_factory()
    b = relay_factory(refuse_tags={"tags": ["q"], "message": "no quotes here"})
    repo, on_a, on_b = two_remote_history(own, a, b)
    publish(a.url, on_a)
    publish(b.url, on_b)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [a, b])
    prometheus = prometheus_factory([f"127.0.0.1:{gsync.metrics_port}"])
    wanted = [e for e in on_a + on_b if e.pubkey != carol.pubkey]
    assert_arrives(own, wanted, timeout=60, what="the world's history on the own relay")
    # A live event after the history, so rates over the last seconds see something move.
    publish(a.url, [f.comment(alice, on_a[2], content="live")])

    def scraped_enough():
        # rate() needs two samples in its window after the counters moved
        up = prometheus.query('count_over_time(up{job="gsync"}[15s])')
        return up and float(up[0]["value"][1]) >= 5 and prometheus.query("gsync_paused_coverage > 0")

    wait_until(scraped_enough, timeout=60, interval=0.5, what="prometheus scraping gsync")
    instances = prometheus.api("label/instance/values", **{"match[]": "ngit_sync_relays_tracked_total"})
    assert instances == [f"127.0.0.1:{gsync.metrics_port}"]
    empty = [(title, expr) for title, expr in dashboard_queries() if not prometheus.query(expr)]
    assert not empty, "queries without data:\n" + "\n".join(f"  {t}: {e}" for t, e in empty)
    # The alert rules load and evaluate on the real server.
    groups = prometheus.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 11 and all(r["health"] == "ok" for r in rules), rules
    assert prometheus.query("gsync_ready == 1") and prometheus.query("gsync_own_relay_up == 1")
    # Pending (its `for:` is an hour): the relay that refuses quotes, and only that.
    alerts = prometheus.api("alerts")["alerts"]
    assert [(x["labels"]["alertname"], x["labels"].get("relay"), x["state"]) for x in alerts] == [
        ("GsyncCoveragePaused", b.url, "pending")]
