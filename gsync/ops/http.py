"""The operator endpoint on ``[metrics] listen``: /metrics, /status (JSON for ``gsync status``),
/healthz (200 while the manager loop is alive)."""
from __future__ import annotations

import json

from gevent.pywsgi import WSGIServer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import metrics


def make_app(manager):
    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            manager.update_metrics(manager.clock())
            body, ctype, status = generate_latest(metrics.REGISTRY), CONTENT_TYPE_LATEST, "200 OK"
        elif path == "/status":
            body = json.dumps(manager.status_snapshot(), indent=1).encode()
            ctype, status = "application/json", "200 OK"
        elif path == "/healthz":
            alive = manager.alive_recently(10.0)
            body, ctype = (b"ok\n" if alive else b"manager stalled\n"), "text/plain"
            status = "200 OK" if alive else "503 Service Unavailable"
        else:
            body, ctype, status = b"not found\n", "text/plain", "404 Not Found"
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(listen: tuple[str, int], manager) -> WSGIServer:
    server = WSGIServer(listen, make_app(manager), log=None)
    server.start()
    return server
