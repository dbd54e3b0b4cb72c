"""A MongoDB wire-protocol server that refuses every login, as ``mongod --auth`` does for a
wrong password: for the dispatcher's exit on fatal store errors, end to end.

Why a stand-in of our own: mongo-java-server (the suite's local server) has no
authentication at all — its backend knows no ``saslStart``/``saslContinue`` (it answers
``no such command``), so a wrong password cannot be reproduced with it, and ``mongod`` is not
installed here.

It speaks the real protocol, with real BSON: the handshake (``isMaster`` over ``OP_QUERY``,
answered with ``OP_REPLY``; ``hello`` over ``OP_MSG``) is answered like a MongoDB 7.0
standalone that supports SCRAM, without ``speculativeAuthenticate`` in the reply (a server
may omit it; the driver then runs the whole SASL conversation). ``saslStart`` and
``saslContinue`` get exactly the reply ``mongod`` sends when the credentials are wrong:
``{ok: 0, errmsg: "Authentication failed.", code: 18, codeName: "AuthenticationFailed"}``.
Other commands get ``{ok: 1}``.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import bson

OP_REPLY = 1
OP_QUERY = 2004
OP_MSG = 2013

AUTH_FAILED: dict[str, Any] = {"ok": 0.0, "errmsg": "Authentication failed.", "code": 18,
                               "codeName": "AuthenticationFailed"}


def _hello(request: dict[str, Any], connection_id: int) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "helloOk": True, "isWritablePrimary": True, "ismaster": True,
        "maxBsonObjectSize": 16 * 1024 * 1024, "maxMessageSizeBytes": 48_000_000,
        "maxWriteBatchSize": 100_000, "localTime": datetime.now(UTC),
        "logicalSessionTimeoutMinutes": 30, "connectionId": connection_id,
        "minWireVersion": 0, "maxWireVersion": 21, "readOnly": False, "ok": 1.0,
    }
    if "saslSupportedMechs" in request:
        reply["saslSupportedMechs"] = ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    return reply


def _answer(command: dict[str, Any], connection_id: int, log: list[str]) -> dict[str, Any]:
    name = next(iter(command), "")
    log.append(name)
    if name.lower() in ("hello", "ismaster"):
        return _hello(command, connection_id)
    if name in ("saslStart", "saslContinue", "authenticate"):
        return dict(AUTH_FAILED)
    return {"ok": 1.0}


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        connection_id = self.server.next_connection_id()
        while True:
            header = _read(sock, 16)
            if header is None:
                return
            length, request_id, _to, opcode = struct.unpack("<iiii", header)
            body = _read(sock, length - 16)
            if body is None:
                return
            if opcode == OP_QUERY:
                flags = struct.unpack_from("<i", body)[0]
                del flags
                end = body.index(b"\x00", 4)
                offset = end + 1 + 8  # collection name, numberToSkip, numberToReturn
                size = struct.unpack_from("<i", body, offset)[0]
                command = bson.decode(body[offset:offset + size])
                reply = bson.encode(_answer(command, connection_id, self.server.commands))
                payload = struct.pack("<iqii", 0, 0, 0, 1) + reply
                sock.sendall(struct.pack("<iiii", 16 + len(payload), 0, request_id, OP_REPLY)
                             + payload)
            elif opcode == OP_MSG:
                # flagBits, then sections; the command is the kind-0 section.
                command = _msg_command(body)
                reply = bson.encode(_answer(command, connection_id, self.server.commands))
                payload = struct.pack("<I", 0) + b"\x00" + reply
                sock.sendall(struct.pack("<iiii", 16 + len(payload), 0, request_id, OP_MSG)
                             + payload)
            else:
                return  # not spoken here: close the connection


def _msg_command(body: bytes) -> dict[str, Any]:
    flags = struct.unpack_from("<I", body)[0]
    end = len(body) - (4 if flags & 1 else 0)  # checksumPresent
    offset = 4
    command: dict[str, Any] = {}
    while offset < end:
        kind = body[offset]
        offset += 1
        size = struct.unpack_from("<i", body, offset)[0]
        if kind == 0:
            command = {**bson.decode(body[offset:offset + size]), **command}
        offset += size
    return command


def _read(sock: socket.socket, n: int) -> bytes | None:
    chunks = b""
    while len(chunks) < n:
        try:
            chunk = sock.recv(n - len(chunks))
        except OSError:
            return None
        if not chunk:
            return None
        chunks += chunk
    return chunks


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.commands: list[str] = []
        self._ids = 0
        self._lock = threading.Lock()

    def next_connection_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids


class RefusingMongo:
    """``with RefusingMongo() as server:`` — listens on ``server.port`` until the block ends;
    ``server.commands`` lists the command names received, in order."""

    def __init__(self) -> None:
        self._server = _Server()
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def commands(self) -> list[str]:
        return self._server.commands

    def uri(self, user: str = "aggbox", password: str = "wrong-password") -> str:
        return f"mongodb://{user}:{password}@127.0.0.1:{self.port}/?directConnection=true"

    def __enter__(self) -> RefusingMongo:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
