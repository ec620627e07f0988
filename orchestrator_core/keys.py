"""API keys: scopes, the key's text, and its stored hash.

A key reads ``ok_<key_id>_<secret>``: ``key_id`` (12 hex digits) finds the stored row, the
secret (43 URL-safe characters, 256 random bits) proves it. Only ``scrypt(secret, salt)`` is
stored; it is compared in constant time. A key is shown once, when it is created.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "ok_"
_KEY = re.compile(r"^ok_([0-9a-f]{12})_([A-Za-z0-9_\-]{43})$")
# scrypt at N=2^14, r=8: ~30 ms and 16 MiB per verification, paid once per key per cache
# period, never on each request.
_N, _R, _P = 2**14, 8, 1


class Scope(enum.IntEnum):
    """Each scope includes the ones below it."""

    READ = 1
    WRITE = 2
    ADMIN = 3

    @classmethod
    def parse(cls, text: str) -> Scope:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown scope {text!r}: one of read, write, admin") from None

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    text: str  # shown once
    salt: str
    digest: str


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for."""

    key_id: str
    name: str | None
    scope: Scope

    def allows(self, required: Scope) -> bool:
        return self.scope >= required


def digest(secret: str, salt: str) -> str:
    return hashlib.scrypt(
        secret.encode(), salt=bytes.fromhex(salt), n=_N, r=_R, p=_P, dklen=32
    ).hex()


def new_key() -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    return NewKey(key_id, f"{PREFIX}{key_id}_{secret}", salt, digest(secret, salt))


def parse(text: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else None."""
    match = _KEY.match(text)
    return (match.group(1), match.group(2)) if match else None


def verify(secret: str, salt: str, stored: str) -> bool:
    return hmac.compare_digest(digest(secret, salt), stored)


def bearer(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header."""
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
