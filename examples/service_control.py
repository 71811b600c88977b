"""Who may steer the service: a bearer token from a file for POST /pause, /resume, /weights.

``ASYNCRL_CONTROL_TOKEN_FILE`` (or ``--control-token-file``) names a file holding
the token (a mounted Kubernetes Secret): one RFC 6750 token (letters, digits and
``-._~+/``, then ``=`` padding; ``openssl rand -hex 32`` or ``-base64 32``). A control
request must send exactly one ``Authorization: Bearer <token>`` header; the
comparison runs in constant time (``hmac.compare_digest``).

The file is read again at every control request (a few dozen bytes), so a rotated
token applies from the next control request after the file's content changed (a
Secret volume: once the kubelet swapped its ``..data`` symlink), with no restart, and
the old token is refused from then on. If the file cannot be used mid-run (deleted,
unreadable, empty, oversized, not a token), control requests are refused with 503
until it can (fail closed: deleting the file is how a token is revoked; no earlier
token stays valid) and the service logs one WARNING per cause, not one per request;
collection goes on. Without a token file, control requests are answered only from
loopback (a ``kubectl port-forward``, a sidecar): any other client gets 403 naming the
setting. GET endpoints stay open.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("examples.service")

#: The most bytes of a token file that are read: a token is a few dozen.
MAX_TOKEN_BYTES = 4096
#: RFC 6750's b64token: what a token file must hold, and what a request's credentials are.
TOKEN = re.compile(rb"[A-Za-z0-9\-._~+/]+=*")
#: ``Bearer <token>`` (the scheme is case-insensitive; RFC 6750 section 2.1).
BEARER = re.compile(rb"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]+=*) *")
#: Longest Authorization value looked at: the longest token plus its scheme and spaces.
MAX_AUTHORIZATION = MAX_TOKEN_BYTES + 64


class ControlToken:
    """The bearer token control requests need; None path: loopback clients only.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "token"
    >>> _ = path.write_text("s3cret\\n")
    >>> token = ControlToken(path)
    >>> token.allows("Bearer s3cret"), token.allows("Bearer nope"), token.allows(None)
    (True, False, False)
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self._token = b""
        #: Why the file cannot be used now (logged once per cause); None while it can.
        self.broken: str | None = None
        if self.path is not None:
            self._token = self._load()  # a file unusable at start stops the service

    def _load(self) -> bytes:
        """The token FILE holds now; ``OSError`` / ``ValueError`` saying why it cannot be used."""
        assert self.path is not None
        try:
            with self.path.open("rb") as file:  # follows the kubelet's ..data symlinks
                token = file.read(MAX_TOKEN_BYTES + 1).strip()
        except OSError as exc:
            raise OSError(f"cannot read the control token file {self.path}: {exc}") from None
        if not token:
            raise ValueError(f"the control token file {self.path} is empty: write a token "
                             "into it (e.g. openssl rand -hex 32), or unset "
                             "ASYNCRL_CONTROL_TOKEN_FILE to allow loopback clients only")
        if len(token) > MAX_TOKEN_BYTES:
            raise ValueError(f"the control token file {self.path} holds more than "
                             f"{MAX_TOKEN_BYTES} bytes: expected one token")
        if TOKEN.fullmatch(token) is None:
            raise ValueError(f"the control token file {self.path} does not hold one RFC 6750 "
                             "token: expected letters, digits and -._~+/ then '=' padding "
                             "(openssl rand -hex 32), no spaces or other characters")
        return token

    def current(self) -> bytes | None:
        """The token of the file now, or None while it cannot be used (logged once per cause)."""
        try:
            token = self._load()
        except (OSError, ValueError) as exc:
            if str(exc) != self.broken:
                log.warning("%s: control requests are refused (503) until it is fixed", exc)
            self.broken, self._token = str(exc), b""
            return None
        if self.broken is not None:
            log.warning("control token file %s can be used again: control requests are "
                        "answered", self.path)
        elif token != self._token:
            log.info("control token file %s changed: the new token applies", self.path)
        self.broken, self._token = None, token
        return token

    def allows(self, authorization: str | None) -> bool:
        """True if ``authorization`` (the header's value) carries the current token."""
        if self.path is None:
            return False
        token = self.current()
        given = _credentials(authorization)
        if token is None or given is None:
            return False
        return hmac.compare_digest(given, token)

    def refusal(self, request: Request) -> JSONResponse | None:
        """None if ``request`` may steer the service, else the answer that refuses it."""
        if self.path is None:
            if _loopback(request):
                return None
            return JSONResponse(
                {"error": "control endpoints answer loopback clients only when no token is "
                          "configured: set ASYNCRL_CONTROL_TOKEN_FILE (--control-token-file) "
                          "and send 'Authorization: Bearer <token>'"}, status_code=403)
        sent = request.headers.getlist("authorization")
        if len(sent) > 1:  # which one counts would depend on who reads it (a proxy, us)
            return JSONResponse(
                {"error": f"expected one Authorization header, got {len(sent)}"},
                status_code=400)
        if self.allows(sent[0] if sent else None):
            return None
        if self.broken is not None:  # (the cause is in the log, not told to the client)
            return JSONResponse(
                {"error": "control is refused: the service cannot use its control token file "
                          "(its log says why); it is read again at every request"},
                status_code=503)
        return JSONResponse(
            {"error": "expected 'Authorization: Bearer <token>' with the token of "
                      "ASYNCRL_CONTROL_TOKEN_FILE; " + _what_came(sent)},
            status_code=401, headers={"WWW-Authenticate": 'Bearer realm="asyncrl-control"'})


def _credentials(authorization: str | None) -> bytes | None:
    """The token of a ``Bearer <token>`` value, or None for anything else (bounded)."""
    if not authorization or len(authorization) > MAX_AUTHORIZATION:
        return None
    # Starlette decodes header bytes as latin-1: encoding back gives the bytes sent.
    match = BEARER.fullmatch(authorization.encode("latin-1", "replace"))
    return match.group(1) if match is not None else None


def _what_came(sent: list[str]) -> str:
    if not sent:
        return "none came"
    if _credentials(sent[0]) is None:
        return (f"the one sent ({len(sent[0])} characters) is not 'Bearer ' and one RFC 6750 "
                "token")
    return "the one sent does not match"


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["MAX_TOKEN_BYTES", "ControlToken"]
