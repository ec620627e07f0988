"""Keeping credentials out of what the service shows, stores and logs.

One rule, applied wherever text from configuration or from an upstream party leaves the
process or reaches the record (pool listings, step errors, escalations, narration, log
lines): every configured secret is replaced by ``***``, and so is any credential written
into a URL, whether configured or not:

- the user information of a URL: ``https://user:pass@host/`` -> ``https://***@host/``;
- the value of a query parameter whose name says it is a credential (``api_key``,
  ``token``, ``secret``, ``password``, ``sig``, ...): ``?api_key=abc`` -> ``?api_key=***``;
- a bearer token: ``Bearer abc.def`` -> ``Bearer ***``;
- an API key of this service, wherever written: ``ok_<id>_<secret>`` -> ``ok_<id>_***``.

Configured secrets are literal strings (a pool's API key, a URL's password, the Basic
credentials an HTTP client derives from it). A secret shorter than :data:`MIN_SECRET_CHARS`
is not matched literally: it would mask ordinary words; its URL form is still masked.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "***"
MIN_SECRET_CHARS = 4

_SECRET_WORDS = frozenset(
    "key apikey accesskey secretkey privatekey token accesstoken authtoken refreshtoken "
    "secret clientsecret password passwd pwd pass auth authorization sig signature "
    "credential credentials session sessionid".split()
)
# scheme://userinfo@ : userinfo stops at the first character a URL authority cannot hold
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s\"'<>]+)@")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&#;\s\"'<>]+)")
# an API key of this service (``orchestrator_core.keys``): its id is kept, its secret masked
_API_KEY = re.compile(r"(?P<id>\bok_[0-9a-f]{12}_)[A-Za-z0-9_\-]{43}")
_BEARER = re.compile(r"(?P<lead>\bBearer\s+)(?P<token>[A-Za-z0-9\-._~+/]+=*)", re.IGNORECASE)


def secret_param(name: str) -> bool:
    """Whether a query parameter named ``name`` carries a credential (``api_key``,
    ``access_token``, ``X-Amz-Signature``, ``password``, ...)."""
    return any(part in _SECRET_WORDS for part in re.split(r"[_.\-]", name.lower()))


def _param_value(match: re.Match[str]) -> str:
    if secret_param(match["name"]) and match["value"] != MASK:
        return f"{match['lead']}{MASK}"
    return match[0]


def scrub_url_credentials(text: str) -> str:
    """``text`` with every credential written in a URL form (and bearer tokens) masked."""
    if "://" in text:
        text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    if "=" in text:
        text = _QUERY_PARAM.sub(_param_value, text)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(lambda m: f"{m['lead']}{MASK}", text)
    if "ok_" in text:  # this service's own API keys, wherever they were written
        text = _API_KEY.sub(lambda m: f"{m['id']}{MASK}", text)
    return text


def url_secrets(url: str | None) -> list[str]:
    """The credentials written in ``url``: its password (also percent-decoded), its
    ``user:password`` pair and that pair's Basic encoding, and secret query values."""
    if not url or ("@" not in url and "=" not in url):
        return []
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
        query = parse_qsl(parts.query, keep_blank_values=False)
    except ValueError:  # not a URL this parser reads: its text form is still masked
        return []
    found: list[str] = []
    if password:
        found += [password, unquote(password)]
    if username:
        user = unquote(username)
        pair = f"{user}:{unquote(password or '')}"
        found += [pair, base64.b64encode(pair.encode()).decode()]
        if password is None:  # a lone user field is a token (https://TOKEN@host)
            found += [username, user]
    found += [value for name, value in query if secret_param(name)]
    return found


class Scrubber:
    """Masks the configured secrets and URL credentials in text and in JSON values."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        kept = {s for s in secrets if s and len(s) >= MIN_SECRET_CHARS and s != MASK}
        # longest first, so a secret that contains another is masked whole
        self.secrets: tuple[str, ...] = tuple(sorted(kept, key=lambda s: (-len(s), s)))

    def __repr__(self) -> str:  # never the secrets themselves
        return f"Scrubber({len(self.secrets)} secrets)"

    def learn(self, secrets: Iterable[str | None]) -> None:
        """Mask ``secrets`` too from now on (a pool created at run time brings its own)."""
        learnt = {s for s in secrets if s and len(s) >= MIN_SECRET_CHARS and s != MASK}
        if not learnt.issubset(self.secrets):
            self.secrets = tuple(sorted({*self.secrets, *learnt}, key=lambda s: (-len(s), s)))

    def union(self, other: Scrubber) -> Scrubber:
        return Scrubber((*self.secrets, *other.secrets))

    def text(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return scrub_url_credentials(text)

    def url(self, url: str | None) -> str | None:
        """A URL as it may be shown: credentials masked, everything else as written."""
        return None if url is None else self.text(url)

    def value(self, value: Any) -> Any:
        """A JSON value with every string in it (not the keys) scrubbed; equal when clean."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value
