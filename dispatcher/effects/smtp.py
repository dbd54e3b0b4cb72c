"""The built-in e-mail effect (``kind = "smtp"``): one plain-text message per effect entry,
sent with the standard library's :mod:`smtplib` (in a worker thread), configured without
code::

    [dispatcher.effects.SendReceipt]
    kind = "smtp"
    host = "smtp.example"
    port = 587
    security = "starttls"
    username = "shop"
    password_env = "SHOP_SMTP_PASSWORD"     # the variable's NAME, never the password
    sender = "Shop <noreply@shop.example>"
    to = "{payload.email}"
    subject = "Your order {aggregate_id}"
    body = "Thank you for order {aggregate_id}."
    on_success = "ReceiptSent"
    on_failure = "ReceiptFailed"

Settings (:class:`SmtpEffectSpec`): ``host``, ``port`` (25), ``security`` (``none``,
``starttls`` or ``tls``), ``username`` and ``password_env`` (together or neither), ``sender``,
``to`` (a comma-separated list after rendering), ``subject``, ``body`` (templates, see
:mod:`~dispatcher.effects.templates`), ``timeout_s``, ``max_attempts``, ``on_success``,
``on_failure``.

``Message-ID`` is ``<{idempotency_key}@aggbox>`` — the same on every attempt, so mail systems
and recipients can recognise a duplicate — and ``X-Aggbox-Effect-Id`` carries the key. The
success reply is ``{"message_id", "recipients"}`` (plus ``refused`` when the server accepted
only some recipients). SMTP replies 4xx, a lost connection and timeouts are
:class:`~aggregates.domain.effects.RetryableEffectError`; 5xx (authentication failure
included) is :class:`~aggregates.domain.effects.PermanentEffectError` (``effect_rejected``). An
SMTP server cannot be asked whether a message was sent, so the effect has no query and its
guarantee is ``at-least-once``.
"""

from __future__ import annotations

import asyncio
import email.utils
import smtplib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any, Final, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.domain.effects import Effect, EffectCall, PermanentEffectError, RetryableEffectError
from dispatcher.effects.secrets import check_env_secret, read_env_secret
from dispatcher.effects.templates import (
    Template,
    header_escape,
    load_spec,
    parse_template,
    render_template,
    text_escape,
)

__all__ = ["SmtpEffectSpec", "message_id", "smtp_effect"]

_HINTS: Final = {
    "password": " (a password never goes in the configuration: put it in an environment "
                "variable and name that variable in password_env)",
}
#: Characters kept as they are in the Message-ID's left part (RFC 5322 atext and ``.``).
_MSGID_SAFE: Final = "!#$&'*+/=?^_`{|}~.-"


class SmtpEffectSpec(BaseModel):
    """The settings of an e-mail effect (the TOML table ``[dispatcher.effects.<type>]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    kind: Literal["smtp"] = "smtp"
    host: str = Field(min_length=1)
    port: int = Field(25, ge=1, le=65535)
    security: Literal["none", "starttls", "tls"] = "none"
    username: str | None = None
    password_env: str | None = None
    sender: str
    to: str
    subject: str
    body: str
    timeout_s: float = Field(10.0, gt=0, le=3600)
    max_attempts: int = Field(5, ge=1, le=1000)
    on_success: str = Field(min_length=1)
    on_failure: str = Field(min_length=1)


def smtp_effect(type: str, settings: Mapping[str, Any], *, setting_prefix: str) -> Effect:
    """The :class:`~aggregates.domain.effects.Effect` for message ``type`` configured by
    ``settings``; :class:`ConfigurationError` naming ``{setting_prefix}.{setting}``."""
    p = setting_prefix
    spec = load_spec(SmtpEffectSpec, settings, setting_prefix=p, hints=_HINTS)
    if spec.on_success == spec.on_failure:
        raise ConfigurationError(f"{p}.on_failure: must differ from on_success "
                                 f"({spec.on_success!r}), so the aggregate can tell them apart")
    if (spec.username is None) != (spec.password_env is None):
        missing = "password_env" if spec.password_env is None else "username"
        raise ConfigurationError(f"{p}.{missing}: username and password_env go together")
    if spec.password_env is not None:
        check_env_secret(spec.password_env, setting=f"{p}.password_env", what="the password")
    templates = _Templates(
        sender=_line_template(spec.sender, f"{p}.sender"),
        to=_line_template(spec.to, f"{p}.to"),
        subject=_line_template(spec.subject, f"{p}.subject"),
        body=parse_template(spec.body, setting=f"{p}.body"),
    )
    mailer = _Mailer(spec, templates)
    return Effect(type, mailer.call, spec.on_success, spec.on_failure, query=None,
                  timeout_s=spec.timeout_s, max_attempts=spec.max_attempts, idempotent=False,
                  kind="smtp")


def _address_escape(value: str) -> str:
    """A substituted value is one address at most: a ``,`` or ``;`` in it (or a line
    break) would add recipients the template did not name, so it is refused."""
    if any(c in value for c in ",;"):
        raise ValueError("the value contains ',' or ';', which would add recipients")
    return header_escape(value)


def message_id(idempotency_key: str) -> str:
    """The ``Message-ID`` of the mail sent for an effect entry: ``<key@aggbox>`` (characters
    not allowed there percent-encoded)."""
    return f"<{quote(idempotency_key, safe=_MSGID_SAFE)}@aggbox>"


def _line_template(text: str, setting: str) -> Template:
    template = parse_template(text, setting=setting)
    if any(c in template.literals() for c in "\r\n\x00"):
        raise ConfigurationError(f"{setting}: must be one line")
    return template


@dataclass(frozen=True, slots=True)
class _Templates:
    sender: Template
    to: Template
    subject: Template
    body: Template


@dataclass(frozen=True, slots=True)
class _Mail:
    message: EmailMessage
    sender: str
    recipients: list[str]


class _Mailer:
    def __init__(self, spec: SmtpEffectSpec, templates: _Templates) -> None:
        self.spec = spec
        self.templates = templates

    async def call(self, call: EffectCall) -> dict[str, Any]:
        mail = self._message(call)
        password = self._password()
        refused = await asyncio.to_thread(self._send, mail, password)
        result: dict[str, Any] = {"message_id": str(mail.message["Message-ID"]),
                                  "recipients": [r for r in mail.recipients if r not in refused]}
        if refused:
            result["refused"] = [{"address": address, "code": code,
                                  "message": _text(message)}
                                 for address, (code, message) in refused.items()]
        return result

    def _password(self) -> str | None:
        if self.spec.password_env is None:
            return None
        return read_env_secret(self.spec.password_env, setting="password_env")

    def _message(self, call: EffectCall) -> _Mail:
        t = self.templates
        sender_text = render_template(t.sender, call, escape=header_escape).strip()
        sender = _address(sender_text, t.sender.setting)
        to_text = render_template(t.to, call, escape=_address_escape)
        entries = [e.strip() for e in to_text.split(",") if e.strip()]
        if not entries:
            raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                       f"{t.to.setting}: no recipient (rendered {to_text!r})")
        recipients = [_address(e, t.to.setting) for e in entries]
        message = EmailMessage()
        try:
            message["From"] = sender_text
            message["To"] = ", ".join(entries)
            message["Subject"] = render_template(t.subject, call, escape=header_escape)
            message["Message-ID"] = message_id(call.idempotency_key)
            message["X-Aggbox-Effect-Id"] = header_escape(call.idempotency_key)
            message["Date"] = (email.utils.format_datetime(call.created_at)
                               if call.created_at is not None and call.created_at.tzinfo
                               else email.utils.formatdate(usegmt=True))
            message.set_content(render_template(t.body, call, escape=text_escape),
                                charset="utf-8")
        except (ValueError, TypeError) as exc:
            raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                       f"cannot build the message: {exc}") from None
        return _Mail(message, sender, recipients)

    def _send(self, mail: _Mail, password: str | None) -> dict[str, tuple[int, bytes]]:
        """Send ``mail`` (blocking; in a worker thread); the refused recipients."""
        spec = self.spec
        where = f"SMTP {spec.host}:{spec.port}"
        try:
            smtp: smtplib.SMTP
            if spec.security == "tls":
                smtp = smtplib.SMTP_SSL(spec.host, spec.port, timeout=spec.timeout_s,
                                        context=ssl.create_default_context())
            else:
                smtp = smtplib.SMTP(spec.host, spec.port, timeout=spec.timeout_s)
            with smtp:
                if spec.security == "starttls":
                    smtp.starttls(context=ssl.create_default_context())
                if spec.username is not None and password is not None:
                    smtp.login(spec.username, password)
                return smtp.send_message(mail.message, from_addr=mail.sender,
                                         to_addrs=mail.recipients)
        except smtplib.SMTPConnectError as exc:
            raise RetryableEffectError(
                f"{where}: connection refused by the server: {exc.smtp_code} "
                f"{_text(exc.smtp_error)}") from None
        except smtplib.SMTPRecipientsRefused as exc:
            codes = {code for code, _ in exc.recipients.values()}
            detail = f"{where}: all recipients refused: " + "; ".join(
                f"{address}: {code} {_text(message)}"
                for address, (code, message) in exc.recipients.items())
            if any(code >= 500 for code in codes):
                raise PermanentEffectError(Reason.EFFECT_REJECTED, detail) from None
            raise RetryableEffectError(detail) from None
        except smtplib.SMTPResponseException as exc:
            # SMTPSenderRefused, SMTPDataError, SMTPAuthenticationError, SMTPHeloError, …
            detail = (f"{where}: {type(exc).__name__}: {exc.smtp_code} "
                      f"{_text(exc.smtp_error)}")
            if 400 <= exc.smtp_code < 500:
                raise RetryableEffectError(detail) from None
            raise PermanentEffectError(Reason.EFFECT_REJECTED, detail) from None
        except smtplib.SMTPServerDisconnected as exc:
            raise RetryableEffectError(f"{where}: server disconnected: {exc}") from None
        except smtplib.SMTPException as exc:
            # SMTPNotSupportedError (no STARTTLS/AUTH), no suitable auth mechanism, …
            raise PermanentEffectError(
                Reason.EFFECT_REJECTED, f"{where}: {type(exc).__name__}: {exc}") from None
        except OSError as exc:  # refused, unreachable, TLS failure, socket timeout
            raise RetryableEffectError(f"{where}: {type(exc).__name__}: {exc}") from None


def _address(entry: str, setting: str) -> str:
    _name, address = email.utils.parseaddr(entry)
    if (not address or "@" not in address or any(c.isspace() for c in address)
            or address.startswith("@") or address.endswith("@")):
        raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                   f"{setting}: {entry!r} is not an e-mail address")
    return address


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
