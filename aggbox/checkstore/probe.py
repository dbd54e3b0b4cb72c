"""Is it MongoDB at all? (I/O, read-only.) When pymongo finds no server, the URI's hosts are
asked once more, by hand: a TCP connection, MongoDB's ``hello`` as an ``OP_MSG``, and the
reply's header read back. A host that accepts the connection and then closes it, or answers
with bytes that are no reply to that message (a Kafka broker, a web server, …), is not a
MongoDB server — which is what the user needs to hear, rather than "not reachable".

Nothing is said (``None``) when no host accepts a connection (that is "not reachable"), when
one answers like MongoDB (then pymongo's own error stands: a replica set name, TLS, …), when
one stays silent (a hung server looks the same), or when the URI cannot be probed by hand
(``mongodb+srv``, TLS, a Unix socket). When pymongo saw every host silent, the hosts are not
asked at all (:func:`silent`): a server that accepts and never answers costs one timeout."""

from __future__ import annotations

import itertools
import socket
import struct
from collections.abc import Sequence
from typing import Final

import bson

__all__ = ["OP_MSG", "OP_REPLY", "hello_message", "not_mongodb", "reply_problem", "silent"]

OP_REPLY: Final = 1
OP_MSG: Final = 2013
#: MongoDB's own limit on a message (``maxMessageSizeBytes``).
_MAX_MESSAGE: Final = 48_000_000
_HEADER: Final = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
_request_ids = itertools.count(0x5A6B)


def hello_message(request_id: int) -> bytes:
    """An ``OP_MSG`` holding ``{hello: 1, $db: "admin"}`` (flags 0, one body section)."""
    body = b"\x00\x00\x00\x00" + b"\x00" + bson.encode({"hello": 1, "$db": "admin"})
    return _HEADER.pack(_HEADER.size + len(body), request_id, 0, OP_MSG) + body


def reply_problem(header: bytes, request_id: int) -> str | None:
    """Why ``header`` (the first bytes read back) is no MongoDB reply to ``request_id``;
    ``None`` when it is one."""
    if len(header) < _HEADER.size:
        if not header:
            return "closed the connection without answering MongoDB's hello"
        return (f"answered {len(header)} byte(s) ({header[:8].hex()}) and closed the "
                "connection: no MongoDB reply")
    length, _, response_to, opcode = _HEADER.unpack(header[:_HEADER.size])
    if opcode not in (OP_MSG, OP_REPLY) or response_to != request_id \
            or not _HEADER.size < length <= _MAX_MESSAGE:
        shown = header[:16].decode("ascii", errors="replace")
        printable = "".join(c if c.isprintable() else "." for c in shown)
        return f"answered MongoDB's hello with {printable!r}…, which is no MongoDB reply"
    return None


def _hosts(uri: str) -> list[tuple[str, int]] | None:
    from pymongo.errors import InvalidURI
    from pymongo.uri_parser import parse_uri

    if not uri.startswith("mongodb://"):
        return None  # mongodb+srv: resolving it is pymongo's business
    try:
        parsed = parse_uri(uri)
    except (InvalidURI, ValueError):
        return None
    options = {k.lower(): v for k, v in parsed["options"].items()}
    if options.get("tls") or options.get("ssl"):
        return None
    return [(host, int(port)) for host, port in parsed["nodelist"]
            if not host.endswith(".sock")]


def _ask(host: str, port: int, timeout_s: float) -> str | None:
    request_id = next(_request_ids)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None  # not even a connection: "not reachable" says it
    with sock:
        try:
            sock.sendall(hello_message(request_id))
            data = b""
            while len(data) < _HEADER.size:
                chunk = sock.recv(_HEADER.size - len(data))
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            return None  # silent: a hung MongoDB looks the same
        except OSError:  # reset by the peer: it does not want our hello
            data = b""
    return reply_problem(data, request_id)


def silent(server_errors: Sequence[BaseException | None]) -> bool:
    """pymongo's monitors got no answer from any host within the timeout (no error yet, or
    a timeout: ``server_errors`` are the errors of the topology's server descriptions). The
    probe would then only wait as long again for the same silence (it says nothing of a
    silent host), so the caller does not ask: an unanswering server costs one timeout."""
    from pymongo.errors import NetworkTimeout

    return all(e is None or isinstance(e, NetworkTimeout) for e in server_errors)


def not_mongodb(uri: str, timeout_s: float) -> str | None:
    """``"<host>:<port> <what it did>"`` for the first host of ``uri`` that accepts a
    connection but is not a MongoDB server; ``None`` otherwise (see the module docstring)."""
    hosts = _hosts(uri)
    for host, port in hosts or []:
        problem = _ask(host, port, min(timeout_s, 5.0))
        if problem:
            return f"{host}:{port} {problem}"
    return None
