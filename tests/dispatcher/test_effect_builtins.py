"""The built-in effects (dispatcher.effects.http / smtp / builtin / templates) against real
servers on loopback (tests/dispatcher/effectservers.py): what each kind sends, and how each
answer — success, retryable, permanent, timeout, a lost response — becomes a result or an
error for the runner. Configuration errors name the setting."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.domain.effects import (
    Effect,
    EffectCall,
    Effects,
    PermanentEffectError,
    RetryableEffectError,
)
from dispatcher.effects.builtin import builtin_effects
from dispatcher.effects.http import http_effect
from dispatcher.effects.smtp import message_id, smtp_effect
from dispatcher.effects.templates import (
    header_escape,
    parse_template,
    render_template,
    text_escape,
    url_escape,
)
from tests.dispatcher.effectservers import MailServer, ShippingServer


@pytest.fixture(scope="module")
def shipping_server() -> Iterator[ShippingServer]:
    with ShippingServer() as server:
        yield server


@pytest.fixture
def shipping() -> Iterator[ShippingServer]:
    with ShippingServer() as server:
        yield server


@pytest.fixture(scope="module")
def mail() -> Iterator[MailServer]:
    with MailServer() as server:
        yield server


def call_for(key: str, *, payload: dict[str, Any] | None = None,
             aggregate_id: str = "order-1", attempt: int = 1,
             headers: dict[str, str] | None = None) -> EffectCall:
    return EffectCall(idempotency_key=key, type="BookShipment",
                      payload=payload if payload is not None else {"sku": "A-1", "qty": 2},
                      aggregate_type="Order", aggregate_id=aggregate_id, attempt=attempt,
                      correlation_id="corr-1", headers=headers or {},
                      created_at=datetime(2026, 11, 23, 12, 0, tzinfo=UTC))


def booking(server: ShippingServer, **settings: Any) -> Effect:
    config: dict[str, Any] = {"url": server.url + "/shipments", "on_success": "ShipmentBooked",
                              "on_failure": "ShipmentFailed", "timeout_s": 5}
    config.update(settings)
    return http_effect("BookShipment", config, setting_prefix="effects.BookShipment")


def run(effect: Effect, call: EffectCall) -> Any:
    async def go() -> Any:
        result = effect.call(call)
        assert asyncio.iscoroutine(result)
        return await asyncio.wait_for(result, effect.timeout_s)
    return asyncio.run(go())


def ask(effect: Effect, call: EffectCall) -> Any:
    assert effect.query is not None
    query = effect.query

    async def go() -> Any:
        result = query(call)
        assert asyncio.iscoroutine(result)
        return await asyncio.wait_for(result, effect.timeout_s)
    return asyncio.run(go())


# --------------------------------------------------------------------------------------------
# HTTP: success and what the server received


def test_http_success_returns_status_and_body_and_sends_the_key(
        shipping_server: ShippingServer) -> None:
    effect = booking(shipping_server)
    assert effect.is_async and effect.kind == "http"
    result = run(effect, call_for("k-success"))
    assert result["status"] == 201
    assert result["body"]["key"] == "k-success"
    assert result["body"]["tracking"].startswith("T-")
    assert "text" not in result
    assert shipping_server.calls_for("k-success") == 1
    assert shipping_server.work_for("k-success") == 1
    [request] = [r for r in shipping_server.requests
                 if r.headers.get("Idempotency-Key") == "k-success"]
    assert request.method == "POST" and request.path == "/shipments"
    assert request.headers["User-Agent"] == "aggbox"
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.body) == {"sku": "A-1", "qty": 2}


def test_http_requests_carry_the_entrys_trace_context(shipping_server: ShippingServer
                                                       ) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    run(booking(shipping_server), call_for("k-trace", headers={
        "traceparent": parent, "tracestate": "k=v", "x-other": "not sent"}))
    run(booking(shipping_server), call_for("k-bad-trace", headers={"traceparent": "00-x"}))
    run(booking(shipping_server, headers={"TraceParent": "{idempotency_key}"}),
        call_for("k-own-trace", headers={"traceparent": parent, "tracestate": "k=v"}))
    sent = {r.headers.get("Idempotency-Key"): r.headers for r in shipping_server.requests}
    assert (sent["k-trace"]["traceparent"], sent["k-trace"]["tracestate"]) == (parent, "k=v")
    assert "x-other" not in sent["k-trace"]
    assert "traceparent" not in sent["k-bad-trace"]  # only a well-formed one is carried
    own = {k.lower(): v for k, v in sent["k-own-trace"].items()}
    assert own["traceparent"] == "k-own-trace" and "tracestate" not in own  # configured wins


def test_http_secret_headers_come_from_the_environment(
        shipping_server: ShippingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """headers_env: the value is read at every request (never from the configuration); a
    value with a line break is refused at load and, if it appears later, at the call."""
    monkeypatch.setenv("TEST_SHIPPING_TOKEN", "Bearer s3cret")
    effect = booking(shipping_server, headers_env={"Authorization": "TEST_SHIPPING_TOKEN"})
    run(effect, call_for("k-secret-1"))
    monkeypatch.setenv("TEST_SHIPPING_TOKEN", "Bearer rotated")
    run(effect, call_for("k-secret-2"))
    sent = {r.headers.get("Idempotency-Key"): r.headers.get("Authorization")
            for r in shipping_server.requests}
    assert sent["k-secret-1"] == "Bearer s3cret" and sent["k-secret-2"] == "Bearer rotated"
    monkeypatch.setenv("TEST_SHIPPING_TOKEN", "Bearer x\r\nX-Injected: 1")
    with pytest.raises(PermanentEffectError, match=r"TEST_SHIPPING_TOKEN.*line break"):
        run(effect, call_for("k-secret-3"))
    with pytest.raises(ConfigurationError, match=r"headers_env.Authorization: .*line break"):
        booking(shipping_server, headers_env={"Authorization": "TEST_SHIPPING_TOKEN"})
    monkeypatch.delenv("TEST_SHIPPING_TOKEN")
    with pytest.raises(PermanentEffectError, match=r"TEST_SHIPPING_TOKEN .* is not set"):
        run(effect, call_for("k-secret-4"))
    assert shipping_server.calls_for("k-secret-3") == 0


def test_http_headers_and_body_template(shipping_server: ShippingServer) -> None:
    effect = booking(shipping_server, method="put",
                     headers={"X-Order": "{aggregate_type}/{aggregate_id}",
                              "X-Attempt": "{attempt}"},
                     body_template='{{"sku": "{payload.sku}", "by": "{correlation_id}"}}',
                     content_type="application/json")
    result = run(effect, call_for("k-tpl", payload={"sku": 'A"1'}, attempt=3))
    assert result["status"] == 201
    [request] = [r for r in shipping_server.requests
                 if r.headers.get("Idempotency-Key") == "k-tpl"]
    assert request.method == "PUT"
    assert request.headers["X-Order"] == "Order/order-1"
    assert request.headers["X-Attempt"] == "3"
    assert json.loads(request.body) == {"sku": 'A"1', "by": "corr-1"}  # JSON-escaped


def test_http_url_placeholders_are_one_percent_encoded_path_segment(
        shipping_server: ShippingServer) -> None:
    effect = booking(shipping_server,
                     url=shipping_server.url + "/shipments/{aggregate_id}/x?ref={payload.ref}")
    awkward = "a/b $c.d?e#f"
    result = run(effect, call_for("k-enc", aggregate_id=awkward,
                                  payload={"ref": "x&y=z"}))
    assert result["status"] == 201
    [request] = [r for r in shipping_server.requests
                 if r.headers.get("Idempotency-Key") == "k-enc"]
    assert request.path == "/shipments/a%2Fb%20%24c.d%3Fe%23f/x?ref=x%26y%3Dz"


def test_http_relative_segment_values_are_refused(shipping_server: ShippingServer) -> None:
    effect = booking(shipping_server, url=shipping_server.url + "/shipments/{aggregate_id}")
    with pytest.raises(PermanentEffectError) as info:
        run(effect, call_for("k-dots", aggregate_id=".."))
    assert "{aggregate_id}" in info.value.detail
    assert shipping_server.calls_for("k-dots") == 0


def test_http_header_value_with_newline_is_permanent(shipping_server: ShippingServer) -> None:
    effect = booking(shipping_server, headers={"X-Customer": "{payload.customer}"})
    with pytest.raises(PermanentEffectError) as info:
        run(effect, call_for("k-crlf", payload={"customer": "bob\r\nX-Admin: yes"}))
    assert info.value.reason == Reason.EFFECT_REJECTED
    assert "effects.BookShipment.headers.X-Customer" in info.value.detail
    assert "{payload.customer}" in info.value.detail
    assert shipping_server.calls_for("k-crlf") == 0


@pytest.mark.parametrize(("payload", "why"), [
    ({}, "the payload has no payload.customer"),
    ({"customer": {"id": 1}}, "dict, not a string"),
    ({"customer": None}, "NoneType, not a string"),
])
def test_http_missing_or_non_scalar_payload_path_is_permanent(
        shipping_server: ShippingServer, payload: dict[str, Any], why: str) -> None:
    effect = booking(shipping_server, url=shipping_server.url + "/shipments/{payload.customer}")
    with pytest.raises(PermanentEffectError) as info:
        run(effect, call_for("k-missing", payload=payload))
    assert info.value.reason == "effect_rejected"
    assert why in info.value.detail and "{payload.customer}" in info.value.detail


# --------------------------------------------------------------------------------------------
# HTTP: failures


def test_http_503_and_429_are_retryable(shipping: ShippingServer) -> None:
    effect = booking(shipping)
    shipping.fail(1, status=503)
    shipping.fail(1, status=429)
    for status in (503, 429):
        with pytest.raises(RetryableEffectError) as info:
            run(effect, call_for("k-retry"))
        assert info.value.reason == Reason.EFFECT_RETRYABLE
        assert f"POST {shipping.url}/shipments -> HTTP {status}" in info.value.detail
    assert shipping.calls_for("k-retry") == 2 and shipping.work_for("k-retry") == 0
    assert run(effect, call_for("k-retry"))["status"] == 201  # the script is used up


def test_http_422_is_permanent_rejection(shipping: ShippingServer) -> None:
    shipping.reject(1, status=422)
    with pytest.raises(PermanentEffectError) as info:
        run(booking(shipping), call_for("k-422"))
    assert info.value.reason == Reason.EFFECT_REJECTED
    assert "HTTP 422" in info.value.detail
    assert shipping.work_for("k-422") == 0


def test_http_redirect_is_not_followed(shipping: ShippingServer) -> None:
    shipping.respond(1, status=302, body=b"")
    with pytest.raises(PermanentEffectError, match="HTTP 302"):
        run(booking(shipping), call_for("k-302"))
    assert shipping.calls_for("k-302") == 1


def test_http_detail_leaves_out_the_query_string(shipping: ShippingServer) -> None:
    shipping.fail(1, status=500)
    effect = booking(shipping, url=shipping.url + "/shipments?token=secret-{aggregate_id}")
    with pytest.raises(RetryableEffectError) as info:
        run(effect, call_for("k-qs"))
    assert "secret" not in str(info.value)
    assert f"{shipping.url}/shipments -> HTTP 500" in info.value.detail


def test_http_hang_times_out_without_work(shipping: ShippingServer) -> None:
    shipping.hang(1, seconds=3)
    effect = booking(shipping, timeout_s=0.5)
    with pytest.raises(TimeoutError):
        run(effect, call_for("k-hang"))
    assert shipping.calls_for("k-hang") == 1
    assert shipping.work_for("k-hang") == 0


def test_http_drop_after_work_is_retryable_but_the_work_was_done(
        shipping: ShippingServer) -> None:
    shipping.drop_after_work(1)
    effect = booking(shipping, query_url=shipping.url + "/shipments/by-key/{idempotency_key}")
    with pytest.raises(RetryableEffectError) as info:
        run(effect, call_for("k-drop"))
    assert "no response" in info.value.detail
    assert shipping.work_for("k-drop") == 1  # called, no result: the query can tell
    found = ask(effect, call_for("k-drop"))
    assert found is not None and found["status"] == 200
    assert found["body"]["key"] == "k-drop"


def test_http_connection_refused_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    effect = http_effect("BookShipment", {"url": f"http://127.0.0.1:{port}/shipments",
                                          "on_success": "A", "on_failure": "B"},
                         setting_prefix="effects.BookShipment")
    with pytest.raises(RetryableEffectError, match="no response"):
        run(effect, call_for("k-refused"))


def test_http_query_none_before_and_payload_after_the_work(shipping: ShippingServer) -> None:
    key = "order/7 $x.y"  # percent-encoded into one segment, decoded by the server
    effect = booking(shipping, query_url=shipping.url + "/shipments/by-key/{idempotency_key}")
    assert effect.guarantee == "once"
    assert ask(effect, call_for(key)) is None
    booked = run(effect, call_for(key))
    found = ask(effect, call_for(key))
    assert found == {"status": 200, "body": booked["body"]}
    assert shipping.work_for(key) == 1  # queries did no work


def test_http_query_other_answers_are_retryable(shipping: ShippingServer) -> None:
    # GET on the POST-only route: 405 must not read as "not done".
    effect = booking(shipping, query_url=shipping.url + "/shipments?key={idempotency_key}")
    with pytest.raises(RetryableEffectError, match=r"query: GET .*/shipments -> HTTP 405"):
        ask(effect, call_for("k-q"))
    with ShippingServer() as other:
        pass  # closed: nothing listens on its port any more
    refused = booking(other, query_url=other.url + "/shipments/by-key/{idempotency_key}")
    with pytest.raises(RetryableEffectError, match="no response"):
        ask(refused, call_for("k-q"))


def test_http_honouring_server_does_the_work_once() -> None:
    with ShippingServer(honour_idempotency=True) as server:
        effect = booking(server, idempotent=True)
        assert effect.guarantee == "once" and effect.query is None
        first = run(effect, call_for("k-idem"))
        second = run(effect, call_for("k-idem", attempt=2))
        assert (first["status"], second["status"]) == (201, 200)
        assert first["body"] == second["body"]
        assert server.calls_for("k-idem") == 2 and server.work_for("k-idem") == 1


def test_http_without_query_is_at_least_once(shipping_server: ShippingServer) -> None:
    effect = booking(shipping_server)
    assert effect.query is None and effect.guarantee == "at-least-once"


def test_http_response_with_dollar_key_keeps_text_only(shipping: ShippingServer) -> None:
    raw = b'{"$where": "1", "ok": true}'
    shipping.respond(1, status=200, body=raw, work=True)
    result = run(booking(shipping), call_for("k-dollar"))
    assert result == {"status": 200, "text": raw.decode()}


@pytest.mark.parametrize(("raw", "has_body"), [
    (b'{"a": {"b.c": 1}}', False),
    (b"[1, 2]", False),
    (b'{"n": NaN}', False),
    (b'{"big": 99999999999999999999}', False),
    (b'{"deep": ' + b'{"x": ' * 25 + b"1" + b"}" * 25 + b"}", False),
    (b'{"nested": {"list": [{"k": "v"}], "f": 1.5, "n": null}}', True),
])
def test_http_response_body_must_be_a_valid_payload(
        shipping: ShippingServer, raw: bytes, has_body: bool) -> None:
    shipping.respond(1, status=200, body=raw)
    result = run(booking(shipping), call_for("k-body"))
    assert ("body" in result) is has_body
    assert ("text" in result) is not has_body
    if has_body:
        assert result["body"] == json.loads(raw)


def test_http_large_response_text_is_truncated(shipping: ShippingServer) -> None:
    shipping.respond(1, status=200, body=b"x" * 2_000_000)
    result = run(booking(shipping), call_for("k-large"))
    assert result == {"status": 200, "text": "x" * 4096}


def test_http_empty_response_is_status_only(shipping: ShippingServer) -> None:
    shipping.respond(1, status=204, body=b"")
    assert run(booking(shipping), call_for("k-204")) == {"status": 204}


# --------------------------------------------------------------------------------------------
# HTTP: configuration errors


BASE: dict[str, Any] = {"url": "http://127.0.0.1:1/shipments", "on_success": "ShipmentBooked",
                        "on_failure": "ShipmentFailed"}


@pytest.mark.parametrize(("change", "message"), [
    ({"url": "http://127.0.0.1:1/{foo}"},
     "effects.BookShipment.url: unknown placeholder {foo}; use one of {aggregate_id}"),
    ({"url": "ftp://example/x"}, "effects.BookShipment.url: "),
    ({"url": "http://{payload.host}/x"}, "scheme and host are written out"),
    ({"url": "http://user:pw@127.0.0.1/x"}, "no user:password@"),
    ({"url": "http://127.0.0.1/a b"}, "effects.BookShipment.url: "),
    ({"url": "http://127.0.0.1/a{{b}}"}, "must be percent-encoded"),
    ({"url": "http://127.0.0.1/{aggregate_id"}, "effects.BookShipment.url: unmatched '{'"),
    ({"url": 5}, "effects.BookShipment.url: Input should be a valid string"),
    ({"method": "TRACE"}, "effects.BookShipment.method:"),
    ({"on_failure": None}, "effects.BookShipment.on_failure"),
    ({"on_failure": "ShipmentBooked"}, "effects.BookShipment.on_failure: must differ"),
    ({"timeout_s": 0}, "effects.BookShipment.timeout_s"),
    ({"max_attempts": True}, "effects.BookShipment.max_attempts"),
    ({"headers": {"Idempotency-Key": "x"}}, "effects.BookShipment.headers.Idempotency-Key"),
    ({"headers": {"Bad Name": "x"}}, "not a valid header name"),
    ({"headers": {"X-A": "{nope}"}}, "effects.BookShipment.headers.X-A: unknown placeholder"),
    ({"query_url": "http://127.0.0.1/{payload.a..b}"},
     "effects.BookShipment.query_url: invalid payload path"),
    ({"method": "GET", "body": "payload"}, "effects.BookShipment.body: a GET request"),
    ({"body": "payload", "body_template": "x"}, "effects.BookShipment.body_template"),
    ({"body": "none", "content_type": "text/plain"}, "effects.BookShipment.content_type"),
    ({"token": "x"}, "effects.BookShipment.token: not a setting"),
    ({"headers_env": {"Authorization": "AGGBOX_TEST_SURELY_UNSET"}},
     "effects.BookShipment.headers_env.Authorization: the environment variable "
     "AGGBOX_TEST_SURELY_UNSET is not set"),
    ({"headers_env": {"Authorization": "not-a-name"}}, "must be the NAME"),
    ({"headers_env": {"Idempotency-Key": "PATH"}}, "headers_env.Idempotency-Key: set by"),
    ({"headers_env": {"X-A": "PATH"}, "headers": {"x-a": "1"}},
     "headers_env.X-A: also in effects.BookShipment.headers"),
])
def test_http_configuration_errors_name_the_setting(change: dict[str, Any],
                                                    message: str) -> None:
    settings = {**BASE, **change}
    if change.get("on_failure", "") is None:
        del settings["on_failure"]
    with pytest.raises(ConfigurationError) as info:
        http_effect("BookShipment", settings, setting_prefix="effects.BookShipment")
    assert message in str(info.value)


def test_http_defaults() -> None:
    effect = http_effect("BookShipment", BASE, setting_prefix="effects.BookShipment")
    assert (effect.timeout_s, effect.max_attempts, effect.idempotent) == (10.0, 5, False)
    assert (effect.on_success, effect.on_failure) == ("ShipmentBooked", "ShipmentFailed")


# --------------------------------------------------------------------------------------------
# templates


def test_templates_literal_braces_and_scalars() -> None:
    template = parse_template("{{x}} {payload.items.1.n} {payload.ok} {payload.f} {attempt}",
                              setting="s")
    call = call_for("k", payload={"items": [{"n": 1}, {"n": 22}], "ok": True, "f": 1.5},
                    attempt=4)
    assert render_template(template, call, escape=text_escape) == "{x} 22 true 1.5 4"
    assert template.placeholders == ("payload.items.1.n", "payload.ok", "payload.f", "attempt")


def test_templates_are_not_str_format() -> None:
    with pytest.raises(ConfigurationError, match="unknown placeholder"):
        parse_template("{payload.__class__}x{0}", setting="s")  # {0}: not a placeholder
    with pytest.raises(ConfigurationError, match="unknown placeholder"):
        parse_template("{aggregate_id.__class__}", setting="s")
    with pytest.raises(ConfigurationError, match="unknown placeholder"):
        parse_template("{aggregate_id!r}", setting="s")


def test_template_escapes() -> None:
    assert url_escape("a/b c?$#") == "a%2Fb%20c%3F%24%23"
    with pytest.raises(ValueError):
        header_escape("a\nb")
    assert header_escape("a b") == "a b"


# --------------------------------------------------------------------------------------------
# SMTP


def mailer(server: MailServer | None, **settings: Any) -> Effect:
    config: dict[str, Any] = {
        "host": "127.0.0.1", "port": server.port if server else 1,
        "sender": "Shop <shop@example.test>", "to": "{payload.email}, audit@example.test",
        "subject": "Order {aggregate_id} confirmed", "body": "Hello {payload.name},\nthanks.",
        "on_success": "ReceiptSent", "on_failure": "ReceiptFailed", "timeout_s": 5}
    config.update(settings)
    return smtp_effect("SendReceipt", config, setting_prefix="effects.SendReceipt")


def mail_call(key: str, **payload: Any) -> EffectCall:
    return call_for(key, payload={"email": "ann@example.test", "name": "Ann Ö", **payload})


def test_smtp_delivers_the_message(mail: MailServer) -> None:
    effect = mailer(mail)
    assert effect.kind == "smtp" and effect.is_async
    result = run(effect, mail_call("mail-1"))
    assert result == {"message_id": "<mail-1@aggbox>",
                      "recipients": ["ann@example.test", "audit@example.test"]}
    [received] = [m for m in mail.messages if m.message_id == "<mail-1@aggbox>"]
    assert received.mail_from == "shop@example.test"
    assert received.rcpt_tos == ["ann@example.test", "audit@example.test"]
    assert received.message["Subject"] == "Order order-1 confirmed"
    assert received.message["X-Aggbox-Effect-Id"] == "mail-1"
    assert received.message["From"] == "Shop <shop@example.test>"
    assert received.message.get_content().replace("\r\n", "\n").strip() == "Hello Ann Ö,\nthanks."
    assert received.message.get_content_type() == "text/plain"


def test_smtp_message_id_is_stable_across_attempts(mail: MailServer) -> None:
    effect = mailer(mail)
    run(effect, mail_call("mail-twice"))
    run(effect, call_for("mail-twice", attempt=2,
                         payload={"email": "ann@example.test", "name": "Ann"}))
    assert mail.count_for_message_id("<mail-twice@aggbox>") == 2  # at-least-once, spottable
    assert message_id("a b<c>@d") == "<a%20b%3Cc%3E%40d@aggbox>"


def test_smtp_451_is_retryable_and_550_permanent(mail: MailServer) -> None:
    effect = mailer(mail)
    mail.fail(1, code=451)
    with pytest.raises(RetryableEffectError) as retry:
        run(effect, mail_call("mail-451"))
    assert "451" in retry.value.detail
    mail.reject(1, code=550)
    with pytest.raises(PermanentEffectError) as permanent:
        run(effect, mail_call("mail-550"))
    assert permanent.value.reason == Reason.EFFECT_REJECTED and "550" in permanent.value.detail
    assert mail.count_for_message_id("<mail-451@aggbox>") == 0
    assert mail.count_for_message_id("<mail-550@aggbox>") == 0


def test_smtp_recipients_refused(mail: MailServer) -> None:
    effect = mailer(mail, to="{payload.email}")
    mail.fail(1, code=450, stage="rcpt")
    with pytest.raises(RetryableEffectError, match="all recipients refused"):
        run(effect, mail_call("mail-rcpt-450"))
    mail.reject(1, code=550, stage="rcpt")
    with pytest.raises(PermanentEffectError, match="all recipients refused"):
        run(effect, mail_call("mail-rcpt-550"))


def test_smtp_partly_refused_recipients_are_reported(mail: MailServer) -> None:
    mail.reject(1, code=550, stage="rcpt")  # the first RCPT: ann
    result = run(mailer(mail), mail_call("mail-partial"))
    assert result["recipients"] == ["audit@example.test"]
    assert result["refused"][0]["address"] == "ann@example.test"
    assert result["refused"][0]["code"] == 550
    assert mail.count_for_message_id("<mail-partial@aggbox>") == 1


def test_smtp_connection_refused_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RetryableEffectError, match="ConnectionRefusedError"):
        run(mailer(None, port=port), mail_call("mail-refused"))


@pytest.mark.parametrize(("payload", "match"), [
    ({"email": "not an address"}, "is not an e-mail address"),
    ({"email": "a@b.test\r\nBcc: x@evil.test"}, "line break"),
    ({"email": "a@b.test, x@evil.test"}, "would add recipients"),
    ({"email": "a@b.test;x@evil.test"}, "would add recipients"),
])
def test_smtp_bad_recipient_is_permanent(mail: MailServer, payload: dict[str, Any],
                                         match: str) -> None:
    with pytest.raises(PermanentEffectError, match=match) as info:
        run(mailer(mail, to="{payload.email}"), mail_call("mail-bad", **payload))
    assert "effects.SendReceipt.to" in info.value.detail


def test_smtp_subject_injection_is_permanent(mail: MailServer) -> None:
    with pytest.raises(PermanentEffectError, match="line break"):
        run(mailer(mail, subject="Hi {payload.name}"), mail_call("m", name="x\nBcc: y@z.test"))


def test_smtp_authentication(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SMTP_PASSWORD", "right")
    with MailServer(users={"shop": "right"}) as server:
        effect = mailer(server, username="shop", password_env="TEST_SMTP_PASSWORD")
        run(effect, mail_call("mail-auth"))
        [received] = server.messages
        assert received.login == "shop" and received.message_id == "<mail-auth@aggbox>"
        monkeypatch.setenv("TEST_SMTP_PASSWORD", "wrong")  # read at every call
        with pytest.raises(PermanentEffectError, match="535") as info:
            run(effect, mail_call("mail-auth-wrong"))
        assert info.value.reason == Reason.EFFECT_REJECTED
        assert len(server.messages) == 1


def test_smtp_has_no_query_and_is_at_least_once(mail: MailServer) -> None:
    effect = mailer(mail)
    assert effect.query is None
    assert effect.idempotent is False
    assert effect.guarantee == "at-least-once"


@pytest.mark.parametrize(("change", "message"), [
    ({"password": "hunter2"}, "effects.SendReceipt.password: not a setting (a password never"),
    ({"security": "ssl"}, "effects.SendReceipt.security"),
    ({"port": 70000}, "effects.SendReceipt.port"),
    ({"username": "shop"}, "effects.SendReceipt.password_env: username and password_env"),
    ({"username": "shop", "password_env": "AGGBOX_TEST_SURELY_UNSET"},
     "effects.SendReceipt.password_env: the environment variable AGGBOX_TEST_SURELY_UNSET"),
    ({"username": "shop", "password_env": "not-a-name"}, "must be the NAME"),
    ({"subject": "Hi {name}"}, "effects.SendReceipt.subject: unknown placeholder {name}"),
    ({"sender": "a@b.test\nBcc: c@d.test"}, "effects.SendReceipt.sender: must be one line"),
    ({"host": ""}, "effects.SendReceipt.host"),
])
def test_smtp_configuration_errors_name_the_setting(change: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        mailer(None, **change)
    assert message in str(info.value)
    assert "hunter2" not in str(info.value)


# --------------------------------------------------------------------------------------------
# builtin_effects


def test_builtin_effects_builds_both_kinds(shipping_server: ShippingServer,
                                           mail: MailServer) -> None:
    effects = builtin_effects({
        "BookShipment": {"kind": "http", "url": shipping_server.url + "/shipments",
                         "on_success": "ShipmentBooked", "on_failure": "ShipmentFailed"},
        "SendReceipt": {"kind": "smtp", "host": "127.0.0.1", "port": mail.port,
                        "sender": "s@example.test", "to": "t@example.test", "subject": "s",
                        "body": "b", "on_success": "ReceiptSent",
                        "on_failure": "ReceiptFailed"},
    })
    assert isinstance(effects, Effects) and len(effects) == 2
    assert effects.get("BookShipment").kind == "http"
    assert effects.get("SendReceipt").kind == "smtp"
    assert run(effects.get("BookShipment"), call_for("k-builtin"))["status"] == 201
    assert shipping_server.work_for("k-builtin") == 1


@pytest.mark.parametrize(("config", "message"), [
    ({"BookShipment": {"kind": "grpc"}}, "effects.BookShipment.kind: unknown effect kind"),
    ({"BookShipment": {}}, "effects.BookShipment.kind: unknown effect kind None"),
    ({"BookShipment": "http"}, "effects.BookShipment.kind:"),
    ({"BookShipment": {"kind": "http", "url": "http://x/{bad}", "on_success": "A",
                       "on_failure": "B"}}, "effects.BookShipment.url: unknown placeholder"),
    ({"SendReceipt": {"kind": "http", "url": "http://x/", "on_success": "A",
                      "on_failure": "B", "host": "h"}}, "effects.SendReceipt.host: not a "),
])
def test_builtin_effects_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        builtin_effects(config)
    assert message in str(info.value)
    assert isinstance(info.value, AggboxError)
