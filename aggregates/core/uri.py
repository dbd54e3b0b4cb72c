"""The one redaction of connection strings, for messages and logs: every layer (the library,
the pipeline, the dispatcher, the command line) may import it."""

from __future__ import annotations

import re

__all__ = ["redact_uri", "redact_uris_in"]


def redact_uri(uri: str) -> str:
    """The URI without its password (safe for messages and logs), also when the password
    holds unescaped ``/``, ``@`` or ``?`` (then rather too much is hidden than too little)."""
    scheme, sep, rest = uri.partition("://")
    userinfo, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return uri
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{hosts}"


#: A URI with user information inside a longer text (an error message quoting one).
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*@\S*")


def redact_uris_in(text: str) -> str:
    """``text`` with every URI in it redacted by :func:`redact_uri`."""
    return _URI_IN_TEXT.sub(lambda m: redact_uri(m.group(0)), text)
