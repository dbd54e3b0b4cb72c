"""The /metrics and /healthz endpoints over real HTTP (aiohttp), without MongoDB: GET, HEAD,
keep-alive, unknown paths and methods, a malformed request, a port already taken."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dispatcher.observe.metrics import Health, Metrics, MetricsServer


def serve(body: Callable[[MetricsServer], Any]) -> Any:
    """Run ``body(server)`` in a thread (blocking HTTP) while the server runs on the loop."""
    async def main() -> Any:
        metrics, health = Metrics(), Health(unhealthy_after_s=30)
        metrics.published.labels("orders").inc(3)
        server = MetricsServer(metrics, health, host="127.0.0.1", port=0)
        await server.start()
        try:
            return await asyncio.to_thread(body, server)
        finally:
            await server.close()

    return asyncio.run(main())


def request(conn: http.client.HTTPConnection, method: str, path: str
            ) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path)
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


def test_metrics_get_and_head_on_one_keep_alive_connection() -> None:
    def body(server: MetricsServer) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        status, headers, text = request(conn, "GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        assert b'aggbox_dispatcher_published_total{collection="orders"} 3.0' in text
        status, headers, text = request(conn, "HEAD", "/metrics")  # same connection
        assert status == 200 and text == b"" and int(headers["content-length"]) > 0
        conn.close()

    serve(body)


def test_healthz_reports_503_then_200_as_json() -> None:
    def body(server: MetricsServer) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        status, headers, text = request(conn, "GET", "/healthz")
        assert status == 503 and headers["content-type"].startswith("application/json")
        assert json.loads(text)["status"] == "unhealthy"  # no worker yet
        server.health.beat("orders", role="active", mode="stream")
        status, _, text = request(conn, "GET", "/healthz")
        report = json.loads(text)
        assert status == 200 and report["collections"]["orders"]["mode"] == "stream"
        status, _, text = request(conn, "HEAD", "/healthz")
        assert status == 200 and text == b""
        conn.close()

    serve(body)


def test_unknown_path_404_other_method_405() -> None:
    def body(server: MetricsServer) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        assert request(conn, "GET", "/nope")[0] == 404
        assert request(conn, "POST", "/metrics")[0] == 405
        conn.close()

    serve(body)


def test_a_malformed_request_gets_400_and_the_server_keeps_serving() -> None:
    def body(server: MetricsServer) -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"THIS IS NOT HTTP\r\n\x00\x01\r\n\r\n")
            reply = s.recv(4096)
        assert reply.split(b" ", 2)[1] == b"400", reply[:80]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        assert request(conn, "GET", "/metrics")[0] == 200
        conn.close()

    serve(body)


def test_a_port_in_use_raises_oserror() -> None:
    async def main(check: Callable[[int], Awaitable[None]]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            await check(s.getsockname()[1])

    async def check(port: int) -> None:
        server = MetricsServer(Metrics(), Health(), host="127.0.0.1", port=port)
        with pytest.raises(OSError):
            await server.start()
        await server.close()

    asyncio.run(main(check))
