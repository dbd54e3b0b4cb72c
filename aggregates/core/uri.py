"""The one redaction of connection strings, for messages and logs: every layer (the library,
the pipeline, the dispatcher, the command line) may import it."""

from __future__ import annotations

__all__ = ["redact_uri"]


def redact_uri(uri: str) -> str:
    """The URI without its password (safe for messages and logs), also when the password
    holds unescaped ``/``, ``@`` or ``?`` (then rather too much is hidden than too little)."""
    scheme, sep, rest = uri.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return uri
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{hosts}"
