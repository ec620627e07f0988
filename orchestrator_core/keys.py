"""API keys: scopes, the key's text, and its stored hash.

A key reads ``ok_<key_id>_<secret>``: ``key_id`` (12 hex digits) finds the stored row, the
secret (43 URL-safe characters, 256 random bits) proves it. A key is shown once, when it is
created; what is stored is ``h1$`` + HMAC-SHA-256 keyed with the server's pepper
(``auth.pepper``) of the salt and the secret, compared in constant time. A slow password hash
buys nothing for a 256-bit random secret (no dictionary reaches it) and made each wrong
secret cost ~30 ms of CPU: a flood of them slowed every request. Digests written before
(scrypt, plain hex) still verify, and are rewritten on their first use.
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
# the digests keys had before HMAC-SHA-256: scrypt at N=2^14, r=8 (~30 ms, 16 MiB each)
_N, _R, _P = 2**14, 8, 1
HMAC_PREFIX = "h1$"


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


def scrypt_digest(secret: str, salt: str) -> str:
    """The digest keys were stored with before ``h1$`` (read, never written)."""
    return hashlib.scrypt(
        secret.encode(), salt=bytes.fromhex(salt), n=_N, r=_R, p=_P, dklen=32
    ).hex()


def digest(secret: str, salt: str, pepper: str = "") -> str:
    """What is stored of a key: ``h1$`` + HMAC-SHA-256(pepper, salt | secret)."""
    mac = hmac.new(pepper.encode(), bytes.fromhex(salt) + secret.encode(), hashlib.sha256)
    return HMAC_PREFIX + mac.hexdigest()


def is_current(stored: str) -> bool:
    """Whether a stored digest is of the current scheme (else it is rewritten when used)."""
    return stored.startswith(HMAC_PREFIX)


def new_key(pepper: str = "") -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    return NewKey(key_id, f"{PREFIX}{key_id}_{secret}", salt, digest(secret, salt, pepper))


def parse(text: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else None."""
    match = _KEY.match(text)
    return (match.group(1), match.group(2)) if match else None


def verify(secret: str, salt: str, stored: str, pepper: str = "") -> bool:
    """Whether ``secret`` is the key's, in constant time for a digest of either scheme."""
    if is_current(stored):
        return hmac.compare_digest(digest(secret, salt, pepper), stored)
    return hmac.compare_digest(scrypt_digest(secret, salt), stored)


# the work done for a key id that has no row: the same HMAC as a real one
_ABSENT_SALT = "00" * 16


def verify_absent(secret: str, pepper: str = "") -> bool:
    """Spend on an unknown key id what a known one costs; always False."""
    hmac.compare_digest(digest(secret, _ABSENT_SALT, pepper), HMAC_PREFIX + "0" * 64)
    return False


def bearer(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header."""
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
