"""Real servers on loopback for the effect tests: an HTTP shipping service and an SMTP server.

Both run in background threads of the test process, on 127.0.0.1 and an ephemeral port, so
they can be used from plain (sync) tests and keep running while a separate dispatcher
process is killed and restarted against them.

:class:`ShippingServer` (HTTP, :mod:`http.server`)::

    with ShippingServer(honour_idempotency=False) as shipping:
        url = shipping.url + "/shipments"      # POST: book; the key is the Idempotency-Key
        shipping.fail(2, status=503)           # the next 2 POSTs: 503, no work
        shipping.hang(1, seconds=3)            # the next POST: no work, sleep, then 503
        shipping.drop_after_work(1)            # the next POST: work done, connection closed
        shipping.reject(1, status=422)         # the next POST: 422, no work
        shipping.respond(1, status=200, body=b'{"$x": 1}', work=True)  # a canned response
        shipping.calls_for(key), shipping.work_for(key), shipping.total_work()
        shipping.requests                      # every request received (method, raw path, …)

``POST /shipments`` (or ``/shipments/<anything>``) books a shipment: ``calls[key]`` counts the
requests, ``work[key]`` the bookings actually made; the reply is 201 ``{"tracking": "T-<n>",
"key": key}``. With ``honour_idempotency=True`` a second POST with a known key books nothing
and returns the stored booking with 200. ``GET /shipments/by-key/<key>`` returns 200 with the
booking if one was made for the key, else 404.

:class:`MailServer` (SMTP, aiosmtpd)::

    with MailServer() as mail:                 # optional users={"shop": "secret"} for AUTH
        mail.fail(1, code=451)                 # the next DATA: 451 (temporary)
        mail.reject(1, code=550, stage="rcpt") # the next RCPT: 550 (permanent)
        mail.host, mail.port, mail.messages, mail.count_for_message_id("<k@aggbox>")
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import json
import socket
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import unquote

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SMTPProtocol
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

__all__ = ["MailServer", "ReceivedMail", "ReceivedRequest", "ShippingServer"]


# --------------------------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the shipping server received it (``path`` is the raw request target,
    percent-encoding included)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class _Fault:
    action: Literal["fail", "hang", "drop", "reject", "respond"]
    status: int = 503
    seconds: float = 0.0
    body: bytes = b""
    work: bool = False


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    shipping: ShippingServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up (timeout, truncated read) resets the connection: expected.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _ShippingHandler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        self._handle("POST")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = ReceivedRequest(method, self.path, {k: v for k, v in self.headers.items()},
                                  body)
        shipping = self.server.shipping
        shipping._record(request)
        path = self.path.split("?", 1)[0]
        if method == "GET" and path.startswith("/shipments/by-key/"):
            booking = shipping._booking(unquote(path[len("/shipments/by-key/"):]))
            if booking is None:
                self._reply(404, {"error": "no booking for this key"})
            else:
                self._reply(200, booking)
            return
        if not (path == "/shipments" or path.startswith("/shipments/")):
            self._reply(404, {"error": f"no route {method} {path}"})
            return
        if method == "GET":
            self._reply(405, {"error": "POST to book a shipment"})
            return
        key = self.headers.get("Idempotency-Key")
        if not key:
            self._reply(400, {"error": "Idempotency-Key header missing"})
            return
        fault = shipping._next_fault(key)
        if fault is None:
            status, booking = shipping._book(key)
            self._reply(status, booking)
        elif fault.action in ("fail", "reject"):
            self._reply(fault.status, {"error": f"scripted {fault.action}"})
        elif fault.action == "hang":
            time.sleep(fault.seconds)
            self._reply(fault.status, {"error": "scripted hang"})
        elif fault.action == "drop":
            shipping._book(key)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        else:  # respond
            if fault.work:
                shipping._book(key)
            self._reply(fault.status, fault.body)

    def _reply(self, status: int, body: dict[str, Any] | bytes) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ShippingServer:
    """A shipping service over HTTP on 127.0.0.1 (see the module docstring). Starts in its
    constructor; :meth:`close` (or the ``with`` block) stops it."""

    def __init__(self, *, honour_idempotency: bool = False) -> None:
        self.honour_idempotency = honour_idempotency
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._work: Counter[str] = Counter()
        self._bookings: dict[str, dict[str, Any]] = {}
        self._faults: deque[_Fault] = deque()
        self._requests: list[ReceivedRequest] = []
        self._counter = 0
        self._server = _HttpServer(("127.0.0.1", 0), _ShippingHandler)
        self._server.shipping = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="shipping-server", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    # scripted faults, for the next n POSTs (in the order they are scripted)

    def fail(self, n: int = 1, status: int = 503) -> None:
        """Answer ``status`` without doing the work."""
        self._script(n, _Fault("fail", status=status))

    def hang(self, n: int = 1, seconds: float = 5.0) -> None:
        """Do not do the work; sleep ``seconds``, then answer 503."""
        self._script(n, _Fault("hang", seconds=seconds))

    def drop_after_work(self, n: int = 1) -> None:
        """Do the work, then close the connection without any response."""
        self._script(n, _Fault("drop"))

    def reject(self, n: int = 1, status: int = 422) -> None:
        """Refuse for good: answer ``status`` without doing the work."""
        self._script(n, _Fault("reject", status=status))

    def respond(self, n: int = 1, *, status: int, body: bytes, work: bool = False) -> None:
        """Answer ``status`` with ``body`` (doing the work first if ``work``)."""
        self._script(n, _Fault("respond", status=status, body=body, work=work))

    def _script(self, n: int, fault: _Fault) -> None:
        with self._lock:
            self._faults.extend([fault] * n)

    # state, thread-safe

    def calls_for(self, key: str) -> int:
        """POST requests received with this Idempotency-Key."""
        with self._lock:
            return self._calls[key]

    def work_for(self, key: str) -> int:
        """Bookings actually made for this key."""
        with self._lock:
            return self._work[key]

    def total_work(self) -> int:
        with self._lock:
            return sum(self._work.values())

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def _record(self, request: ReceivedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _next_fault(self, key: str) -> _Fault | None:
        with self._lock:
            self._calls[key] += 1
            return self._faults.popleft() if self._faults else None

    def _book(self, key: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self.honour_idempotency and key in self._bookings:
                return 200, dict(self._bookings[key])
            self._counter += 1
            self._work[key] += 1
            booking = {"tracking": f"T-{self._counter}", "key": key}
            self._bookings[key] = booking
            return 201, dict(booking)

    def _booking(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            booking = self._bookings.get(key)
            return None if booking is None else dict(booking)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ShippingServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# SMTP


@dataclass(frozen=True)
class ReceivedMail:
    """One message the mail server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    message_id: str
    login: str | None = None


@dataclass
class _SmtpFaults:
    rcpt: deque[int] = field(default_factory=deque)
    data: deque[int] = field(default_factory=deque)


class _Handler:
    def __init__(self, server: MailServer) -> None:
        self.server = server

    async def handle_RCPT(self, server: SMTPProtocol, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        code = self.server._next_fault("rcpt")
        if code is not None:
            return _status(code)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTPProtocol, session: Session,
                          envelope: Envelope) -> str:
        code = self.server._next_fault("data")
        if code is not None:
            return _status(code)
        content = envelope.original_content or b""
        message = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        login = getattr(session, "auth_data", None)
        self.server._accept(ReceivedMail(
            mail_from=str(envelope.mail_from), rcpt_tos=list(envelope.rcpt_tos),
            message=message, message_id=str(message.get("Message-ID", "")),
            login=login.decode() if isinstance(login, bytes) else None))
        return "250 Message accepted for delivery"


def _status(code: int) -> str:
    text = "Try again later" if 400 <= code < 500 else "Rejected"
    enhanced = f"{code // 100}.7.1" if code >= 500 else f"{code // 100}.3.0"
    return f"{code} {enhanced} {text} (scripted)"


class _Authenticator:
    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    def __call__(self, server: SMTPProtocol, session: Session, envelope: Envelope,
                 mechanism: str, auth_data: Any) -> AuthResult:
        if isinstance(auth_data, LoginPassword):
            login = auth_data.login.decode()
            if self.users.get(login) == auth_data.password.decode():
                return AuthResult(success=True, auth_data=auth_data.login)
        return AuthResult(success=False, handled=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MailServer:
    """An SMTP server on 127.0.0.1 (aiosmtpd, its own thread and event loop). ``users``
    (login → password) offers AUTH (PLAIN/LOGIN, without TLS: loopback only); a wrong
    password is answered with 535. :attr:`ReceivedMail.login` says who logged in."""

    host = "127.0.0.1"

    def __init__(self, *, users: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._messages: list[ReceivedMail] = []
        self._faults = _SmtpFaults()
        kwargs: dict[str, Any] = {}
        if users is not None:
            kwargs.update(authenticator=_Authenticator(users), auth_require_tls=False)
        self.port = _free_port()
        self._controller = Controller(_Handler(self), hostname=self.host, port=self.port,
                                      ready_timeout=10, **kwargs)
        self._controller.start()

    def fail(self, n: int = 1, code: int = 451, *, stage: Literal["data", "rcpt"] = "data"
             ) -> None:
        """Answer the next ``n`` DATA (or RCPT) commands with ``code`` (temporary)."""
        self._script(n, code, stage)

    def reject(self, n: int = 1, code: int = 550, *, stage: Literal["data", "rcpt"] = "data"
               ) -> None:
        """Answer the next ``n`` DATA (or RCPT) commands with ``code`` (permanent)."""
        self._script(n, code, stage)

    def _script(self, n: int, code: int, stage: Literal["data", "rcpt"]) -> None:
        with self._lock:
            getattr(self._faults, stage).extend([code] * n)

    def _next_fault(self, stage: Literal["data", "rcpt"]) -> int | None:
        with self._lock:
            queue: deque[int] = getattr(self._faults, stage)
            return queue.popleft() if queue else None

    def _accept(self, mail: ReceivedMail) -> None:
        with self._lock:
            self._messages.append(mail)

    @property
    def messages(self) -> list[ReceivedMail]:
        with self._lock:
            return list(self._messages)

    def count_for_message_id(self, message_id: str) -> int:
        with self._lock:
            return sum(1 for m in self._messages if m.message_id == message_id)

    def wait_for_messages(self, n: int, *, timeout: float = 10.0) -> list[ReceivedMail]:
        """The messages once there are at least ``n`` (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            messages = self.messages
            if len(messages) >= n:
                return messages
            time.sleep(0.02)
        raise AssertionError(f"expected {n} messages, got {len(self.messages)}")

    def close(self) -> None:
        self._controller.stop()

    def __enter__(self) -> MailServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

