"""Cookie sessions and CSRF for the web UI.

The session cookie holds the user's API token itself (HttpOnly, SameSite=Lax, Path=/ui, Secure
over HTTPS), checked like a bearer token on every request. Why not a signed session id: ingest
is stateless and never writes projections, so a server-side session would need a new table (or
events) and a signing secret shared by every replica; the token already is a revocable,
expiring, per-user secret the database knows, so revoking it ends the UI session too (within
the 10 s cache). The cost: the cookie is as powerful as the token, which is why JavaScript
cannot read it and other sites' requests do not carry it on POSTs.

CSRF: every form carries ``_csrf = HMAC-SHA256(token, "hailstream-ui-csrf")``, which only a
holder of the token can compute, and POSTs without it are 403. The login form, which has no
session yet, uses a double-submit cookie instead (a random value in a cookie and in the form).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from typing import Final

from aiohttp import web

from services.ingest.store import Store, User

SESSION_COOKIE: Final = "hs_session"
LOGIN_COOKIE: Final = "hs_login"
CSRF_FIELD: Final = "_csrf"
COOKIE_PATH: Final = "/ui"
SESSION_MAX_AGE_S: Final = 12 * 3600


class UserCache:
    """Token -> user, cached briefly so page views rarely hit the database (10 s)."""

    def __init__(self, store: Store, ttl_s: float = 10.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, User | None]] = {}

    async def user(self, token: str) -> User | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        hit = self._entries.get(digest)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        found = await asyncio.to_thread(self.store.user_for_token_hash, digest)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = (now, found)
        return found


def session_token(request: web.Request) -> str | None:
    token = request.cookies.get(SESSION_COOKIE, "").strip()
    return token or None


def csrf_for(token: str) -> str:
    """The CSRF value of the session whose token is ``token``."""
    return hmac.new(token.encode(), b"hailstream-ui-csrf", hashlib.sha256).hexdigest()


def csrf_ok(token: str, submitted: str | None) -> bool:
    return bool(submitted) and hmac.compare_digest(csrf_for(token), str(submitted))


def set_session(response: web.StreamResponse, request: web.Request, token: str) -> None:
    response.set_cookie(SESSION_COOKIE, token, path=COOKIE_PATH, httponly=True,
                        samesite="Lax", secure=request.secure, max_age=SESSION_MAX_AGE_S)


def clear_session(response: web.StreamResponse) -> None:
    response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)


def login_nonce(request: web.Request) -> str:
    """The login form's double-submit value: the cookie's if set, else a new one."""
    return request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)


def remember_login_nonce(response: web.StreamResponse, request: web.Request, nonce: str) -> None:
    response.set_cookie(LOGIN_COOKIE, nonce, path=COOKIE_PATH, httponly=True,
                        samesite="Strict", secure=request.secure)


def login_nonce_ok(request: web.Request, submitted: str | None) -> bool:
    cookie = request.cookies.get(LOGIN_COOKIE)
    return bool(cookie) and bool(submitted) and hmac.compare_digest(cookie or "",
                                                                     str(submitted))


def safe_next(value: str | None) -> str:
    """Where to go after logging in: only a path inside the UI (never another site)."""
    if value and value.startswith(COOKIE_PATH + "/") and not value.startswith("//") \
            and "\\" not in value:
        return value
    return f"{COOKIE_PATH}/batches"
