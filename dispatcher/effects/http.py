"""The built-in HTTP webhook effect (``kind = "http"``): one request per effect entry, on
aiohttp's client, configured without code::

    [dispatcher.effects.BookShipment]
    kind = "http"
    url = "https://shipping.example/orders/{aggregate_id}/shipments"
    query_url = "https://shipping.example/shipments/by-key/{idempotency_key}"
    headers_env = { Authorization = "SHIPPING_AUTHORIZATION" }   # the variable's NAME
    on_success = "ShipmentBooked"
    on_failure = "ShipmentFailed"

Settings (:class:`HttpEffectSpec`): ``method`` (GET POST PUT PATCH DELETE, default POST),
``url`` (a template, see :mod:`~dispatcher.effects.templates`; http or https, scheme and host
literal), ``headers`` (name → template), ``headers_env`` (name → the NAME of an environment
variable holding the value: tokens never go in the configuration), ``body`` (``"payload"``:
the entry's payload as JSON, the default for POST/PUT/PATCH; ``"none"``, the default for
GET/DELETE) or
``body_template`` (+ ``content_type``), ``query_url`` (optional: GET it to ask whether the
call took effect — 200 yes, 404/410 no), ``timeout_s``, ``max_attempts``, ``on_success``,
``on_failure`` and ``idempotent`` (the server honours ``Idempotency-Key``).

Every request carries ``Idempotency-Key: <entry id>`` and ``User-Agent: aggbox``, and the
entry's W3C ``traceparent``/``tracestate`` (the effect span's with a tracer provider) unless
a configured header sets them; redirects are not followed. 2xx is success, with the reply
payload ``{"status", "body"}`` (the response JSON object, when it is a valid aggbox payload
of at most :data:`MAX_BODY_BYTES`) or ``{"status", "text"}`` (the first
:data:`MAX_TEXT_CHARS` characters). 408, 425, 429, 5xx and connection failures are
:class:`~aggregates.domain.effects.RetryableEffectError`; other statuses are
:class:`~aggregates.domain.effects.PermanentEffectError` (``effect_rejected``). A timeout is left
as :class:`TimeoutError` for the runner.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final, Literal

import aiohttp
import yarl
from pydantic import BaseModel, ConfigDict, Field, field_validator

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE, trace_headers
from aggregates.domain.effects import Effect, EffectCall, PermanentEffectError, RetryableEffectError
from dispatcher.effects.http_reply import (
    MAX_BODY_BYTES,
    MAX_RESPONSE_BYTES,
    MAX_TEXT_CHARS,
    Reply,
    read_capped,
    reply_detail,
    reply_result,
    shown_url,
)
from dispatcher.effects.secrets import check_env_secret, read_env_secret
from dispatcher.effects.templates import (
    Escape,
    Template,
    header_escape,
    load_spec,
    parse_template,
    render_template,
    text_escape,
    url_escape,
)

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_RESPONSE_BYTES",
    "MAX_TEXT_CHARS",
    "HttpEffectSpec",
    "http_effect",
]

#: Sent from the entry's trace context unless a configured header sets one of them.
_TRACE_HEADERS = frozenset({TRACEPARENT, TRACESTATE})


_RETRYABLE_STATUS: Final = frozenset({408, 425, 429})
_NOT_DONE_STATUS: Final = frozenset({404, 410})
_RESERVED_HEADERS: Final = frozenset({"idempotency-key", "user-agent", "host",
                                      "content-length", "transfer-encoding", "connection"})
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_URL_PREFIX: Final = re.compile(r"https?://[^/?#@\s\\]+[/?#]", re.IGNORECASE)
_URL_WHOLE: Final = re.compile(r"https?://[^/?#@\s\\]+([/?#].*)?", re.IGNORECASE | re.DOTALL)
_BAD_URL_CHAR: Final = re.compile(r"[\s\x00-\x1f\x7f\"<>\\^`|{}]")


class HttpEffectSpec(BaseModel):
    """The settings of an HTTP effect (the TOML table ``[dispatcher.effects.<type>]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["http"] = "http"
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    #: Header name → the NAME of an environment variable holding its value (tokens).
    headers_env: dict[str, str] = Field(default_factory=dict)
    body: Literal["payload", "none"] | None = None
    body_template: str | None = None
    content_type: str | None = None
    query_url: str | None = None
    timeout_s: float = Field(10.0, gt=0, le=3600)
    max_attempts: int = Field(5, ge=1, le=1000)
    on_success: str = Field(min_length=1)
    on_failure: str = Field(min_length=1)
    idempotent: bool = False

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


def http_effect(type: str, settings: Mapping[str, Any], *, setting_prefix: str) -> Effect:
    """The :class:`~aggregates.domain.effects.Effect` for message ``type`` configured by
    ``settings``; :class:`ConfigurationError` naming ``{setting_prefix}.{setting}``."""
    p = setting_prefix
    spec = load_spec(HttpEffectSpec, settings, setting_prefix=p)
    if spec.on_success == spec.on_failure:
        raise ConfigurationError(f"{p}.on_failure: must differ from on_success "
                                 f"({spec.on_success!r}), so the aggregate can tell them apart")
    url = _url_template(spec.url, setting=f"{p}.url")
    query_url = (None if spec.query_url is None
                 else _url_template(spec.query_url, setting=f"{p}.query_url"))
    headers: dict[str, Template] = {}
    for name, value in spec.headers.items():
        setting = f"{p}.headers.{name}"
        _check_header_name(name, setting)
        template = parse_template(value, setting=setting)
        if any(c in template.literals() for c in "\r\n\x00"):
            raise ConfigurationError(f"{setting}: a header value must be one line")
        headers[name] = template
    secret_headers: dict[str, str] = {}
    for name, env in spec.headers_env.items():
        setting = f"{p}.headers_env.{name}"
        _check_header_name(name, setting)
        if name.lower() in {h.lower() for h in headers}:
            raise ConfigurationError(f"{setting}: also in {p}.headers; keep one of them")
        check_env_secret(env, setting=setting, what="the header's value", one_line=True)
        secret_headers[name] = env
    body = _body(spec, p)
    client = _HttpClient(spec, url, query_url, headers, body, secret_headers)
    return Effect(type, client.call, spec.on_success, spec.on_failure,
                  query=None if query_url is None else client.query,
                  timeout_s=spec.timeout_s, max_attempts=spec.max_attempts,
                  idempotent=spec.idempotent, kind="http")


@dataclass(frozen=True, slots=True)
class _Body:
    mode: Literal["payload", "none", "template"]
    content_type: str | None = None
    template: Template | None = None
    escape: Escape = text_escape


def _body(spec: HttpEffectSpec, p: str) -> _Body:
    if spec.body_template is not None:
        if spec.body is not None:
            raise ConfigurationError(f"{p}.body_template: set either body or body_template, "
                                     "not both")
        if spec.method == "GET":
            raise ConfigurationError(f"{p}.body_template: a GET request has no body")
        template = parse_template(spec.body_template, setting=f"{p}.body_template")
        ctype = spec.content_type or "text/plain; charset=utf-8"
        escape: Escape = text_escape
        if "json" in ctype.lower():
            escape = _json_string_escape
        elif "x-www-form-urlencoded" in ctype.lower():
            escape = url_escape
        return _Body("template", _content_type(ctype, p), template, escape)
    mode = spec.body or ("none" if spec.method in ("GET", "DELETE") else "payload")
    if mode == "payload":
        if spec.method == "GET":
            raise ConfigurationError(f"{p}.body: a GET request has no body; use "
                                     "body = \"none\" or another method")
        return _Body("payload", _content_type(spec.content_type or "application/json", p))
    if spec.content_type is not None:
        raise ConfigurationError(f"{p}.content_type: there is no body (body = \"none\")")
    return _Body("none")


def _content_type(value: str, p: str) -> str:
    if not value or any(c in value for c in "\r\n\x00"):
        raise ConfigurationError(f"{p}.content_type: must be one non-empty line")
    return value


def _json_string_escape(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)[1:-1]


def _check_header_name(name: str, setting: str) -> None:
    if not _HEADER_NAME.fullmatch(name):
        raise ConfigurationError(f"{setting}: not a valid header name")
    if name.lower() in _RESERVED_HEADERS:
        raise ConfigurationError(f"{setting}: set by aggbox itself (every request sends "
                                 "Idempotency-Key and User-Agent); remove it")


def _url_template(text: str, *, setting: str) -> Template:
    template = parse_template(text, setting=setting)
    if _BAD_URL_CHAR.search(template.literals()):
        raise ConfigurationError(f"{setting}: {text!r} contains spaces or characters that "
                                 "must be percent-encoded in a URL")
    ok = (_URL_PREFIX.match(template.literal_prefix) if template.placeholders
          else _URL_WHOLE.fullmatch(template.text))
    if not ok:
        raise ConfigurationError(
            f"{setting}: {text!r} must be an http:// or https:// URL whose scheme and host "
            "are written out (placeholders only in the path or query; no user:password@)")
    sample = "".join(p if isinstance(p, str) else "x" for p in template.parts)
    try:
        parsed = yarl.URL(sample, encoded=True)
    except ValueError as exc:
        raise ConfigurationError(f"{setting}: {text!r} is not a valid URL: {exc}") from None
    if parsed.scheme.lower() not in ("http", "https") or not parsed.host:
        raise ConfigurationError(f"{setting}: {text!r} must be an http:// or https:// URL")
    return template


class _HttpClient:
    """Performs the requests of one configured effect (one client session per request:
    nothing is shared between event loops or calls)."""

    def __init__(self, spec: HttpEffectSpec, url: Template, query_url: Template | None,
                 headers: Mapping[str, Template], body: _Body,
                 secret_headers: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.url = url
        self.query_url = query_url
        self.headers = dict(headers)
        #: header → environment variable, read at every request
        self.secret_headers = dict(secret_headers or {})
        self.body = body

    async def call(self, call: EffectCall) -> dict[str, Any]:
        method = self.spec.method
        url = render_template(self.url, call, escape=url_escape)
        data, content_type = self._data(call)
        reply = await self._request(method, url, call, data=data, content_type=content_type)
        status = reply.status
        if 200 <= status < 300:
            return reply_result(reply)
        detail = reply_detail(method, url, reply)
        if status in _RETRYABLE_STATUS or status >= 500:
            raise RetryableEffectError(detail)
        raise PermanentEffectError(Reason.EFFECT_REJECTED, detail)

    async def query(self, call: EffectCall) -> dict[str, Any] | None:
        assert self.query_url is not None
        url = render_template(self.query_url, call, escape=url_escape)
        reply = await self._request("GET", url, call, data=None, content_type=None)
        if reply.status == 200:
            return reply_result(reply)
        if reply.status in _NOT_DONE_STATUS:
            return None
        raise RetryableEffectError("query: " + reply_detail("GET", url, reply))

    def _data(self, call: EffectCall) -> tuple[bytes | None, str | None]:
        body = self.body
        if body.mode == "none":
            return None, None
        if body.mode == "template":
            assert body.template is not None
            return (render_template(body.template, call, escape=body.escape).encode(),
                    body.content_type)
        try:
            text = json.dumps(dict(call.payload), ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False, default=_json_default)
        except (TypeError, ValueError) as exc:
            raise PermanentEffectError(
                Reason.EFFECT_REJECTED, f"the payload cannot be sent as JSON: {exc}") from None
        return text.encode(), body.content_type

    def _headers(self, call: EffectCall, content_type: str | None) -> dict[str, str]:
        headers = {name: render_template(t, call, escape=header_escape)
                   for name, t in self.headers.items()}
        for name, env in self.secret_headers.items():
            headers[name] = read_env_secret(env, setting=f"headers_env.{name}", one_line=True)
        try:
            headers["Idempotency-Key"] = header_escape(call.idempotency_key)
        except ValueError as exc:
            raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                       f"Idempotency-Key: {exc}") from None
        headers["User-Agent"] = "aggbox"
        # W3C trace context over HTTP: the call continues the entry's trace (the effect
        # span's, with a tracer provider) unless a configured header sets it (then neither
        # is sent: a tracestate belongs to its traceparent).
        trace = trace_headers(call.headers)
        if trace and not {name.lower() for name in headers} & _TRACE_HEADERS:
            headers.update(trace)
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    async def _request(self, method: str, url: str, call: EffectCall, *, data: bytes | None,
                       content_type: str | None) -> Reply:
        headers = self._headers(call, content_type)
        shown = shown_url(url)
        timeout = aiohttp.ClientTimeout(total=self.spec.timeout_s)
        try:
            target = yarl.URL(url, encoded=True)
            async with (aiohttp.ClientSession(timeout=timeout) as session,
                        session.request(method, target, headers=headers, data=data,
                                        allow_redirects=False) as response):
                raw, truncated = await read_capped(response)
                return Reply(response.status, raw, truncated, response.charset)
        except TimeoutError:
            raise
        except (aiohttp.InvalidURL, ValueError) as exc:
            raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                       f"{method} {shown}: invalid URL: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise RetryableEffectError(
                f"{method} {shown}: no response: {type(exc).__name__}: {exc}") from None


def _json_default(value: Any) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
