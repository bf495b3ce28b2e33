"""The dashboard's session cookie and CSRF tokens (pure: stdlib hmac, no web framework).

The cookie holds a small JSON payload signed with HMAC-SHA256 under the server's session secret
(``GPUPLAN_SESSION_SECRET``): the id of the server-side session (services/orgs/service.py, a row
that names the key that signed in, never the key itself), the session's CSRF token and when it was
issued. It is readable by whoever holds it but cannot be forged or altered without the secret; the
session row is looked up on every request, so signing out (which ends the row) or revoking the key
ends the session everywhere, including in copies of the cookie. An anonymous session (no session
id) carries only a CSRF token, so the sign-in form is protected too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

COOKIE_NAME = "gpuplan_session"
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True)
class SessionData:
    csrf_token: str
    issued_at_s: float
    session_id: str | None = None

    @property
    def signed_in(self) -> bool:
        return self.session_id is not None


def new_session(now_s: float, session_id: str | None = None) -> SessionData:
    """A fresh session with a new CSRF token (signing in or out always rotates the token)."""
    return SessionData(csrf_token=secrets.token_urlsafe(24), issued_at_s=now_s, session_id=session_id)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, payload: str) -> str:
    return _b64(hmac.new(secret.encode(), payload.encode("ascii"), hashlib.sha256).digest())


def encode(session: SessionData, secret: str) -> str:
    """The cookie value: ``base64(json).base64(hmac)``."""
    body = {"c": session.csrf_token, "t": session.issued_at_s, "s": session.session_id}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{payload}.{_mac(secret, payload)}"


def decode(value: str | None, secret: str, now_s: float, max_age_s: float) -> SessionData | None:
    """The session in a cookie value, or None when it is missing, altered, malformed or expired."""
    if not value or value.count(".") != 1 or len(value) > 4096:
        return None
    payload, mac = value.split(".")
    if not hmac.compare_digest(mac.encode(), _mac(secret, payload).encode()):
        return None
    try:
        body = json.loads(_unb64(payload))
        csrf, issued, session_id = str(body["c"]), float(body["t"]), body["s"]
    except (ValueError, KeyError, TypeError):
        return None
    if not csrf or (session_id is not None and not isinstance(session_id, str)):
        return None
    if not 0 <= now_s - issued <= max_age_s:
        return None
    return SessionData(csrf_token=csrf, issued_at_s=issued, session_id=session_id)


def csrf_ok(session: SessionData | None, submitted: str | None) -> bool:
    """Whether a form's CSRF token is the session's (constant-time comparison)."""
    if session is None or not submitted:
        return False
    return hmac.compare_digest(session.csrf_token.encode(), submitted.encode())


def cookie_flags(https: bool) -> dict[str, bool | str]:
    """HttpOnly (no script reads it), SameSite=Lax (not sent with cross-site POSTs), and Secure when the
    request came over HTTPS (behind a TLS-terminating proxy, run uvicorn with --proxy-headers so the
    scheme is the client's)."""
    return {"httponly": True, "samesite": "lax", "secure": https}
