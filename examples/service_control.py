"""Who may steer the service: a bearer token from a file for POST /pause, /resume, /weights.

``ASYNCRL_CONTROL_TOKEN_FILE`` (or ``--control-token-file``) names a file holding
the token (a mounted Kubernetes Secret). A control request must send
``Authorization: Bearer <token>``; the comparison runs in constant time
(``hmac.compare_digest``), and the file is read again whenever it changes (its
inode, size or mtime: the kubelet swaps a Secret volume's ``..data`` symlink), so
a rotated Secret takes effect without a restart. Without a token file, control
requests are answered only from loopback (a ``kubectl port-forward``, a sidecar):
any other client gets 403 naming the setting. GET endpoints stay open.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("examples.service")

#: The most bytes of a token file that are read: a token is a few dozen.
MAX_TOKEN_BYTES = 4096


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
        self._stamp: tuple[int, int, int] | None = None
        self._token = b""
        if self.path is not None:
            self._read()
            if not self._token:
                raise ValueError(f"the control token file {self.path} is empty: write a token "
                                 "into it (e.g. openssl rand -hex 32), or unset "
                                 "ASYNCRL_CONTROL_TOKEN_FILE to allow loopback clients only")

    def _read(self) -> None:
        """Read the file again if it changed (a rotated Secret); keep the old token on error."""
        assert self.path is not None
        try:
            stat = self.path.stat()  # follows the kubelet's ..data symlinks
            stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if stamp == self._stamp:
                return
            with self.path.open("rb") as file:
                token = file.read(MAX_TOKEN_BYTES + 1).strip()
        except OSError as exc:
            if self._stamp is None:
                raise OSError(f"cannot read the control token file {self.path}: {exc}") from None
            log.warning("cannot read the control token file %s (%s): the previous token stays",
                        self.path, exc)
            return
        if len(token) > MAX_TOKEN_BYTES:
            raise ValueError(f"the control token file {self.path} holds more than "
                             f"{MAX_TOKEN_BYTES} bytes: expected one token")
        if self._stamp is not None:
            log.info("control token file %s changed: the new token applies", self.path)
        self._stamp, self._token = stamp, token

    def allows(self, authorization: str | None) -> bool:
        """True if ``authorization`` (the header's value) carries the current token."""
        if self.path is None:
            return False
        try:
            self._read()
        except (OSError, ValueError) as exc:
            log.warning("%s: control requests are refused", exc)
            return False
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not self._token:
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)

    def refusal(self, request: Request) -> JSONResponse | None:
        """None if ``request`` may steer the service, else the answer that refuses it."""
        if self.path is None:
            if _loopback(request):
                return None
            return JSONResponse(
                {"error": "control endpoints answer loopback clients only when no token is "
                          "configured: set ASYNCRL_CONTROL_TOKEN_FILE (--control-token-file) "
                          "and send 'Authorization: Bearer <token>'"}, status_code=403)
        if self.allows(request.headers.get("authorization")):
            return None
        return JSONResponse(
            {"error": "expected 'Authorization: Bearer <token>' with the token of "
                      "ASYNCRL_CONTROL_TOKEN_FILE; "
                      + ("none came" if "authorization" not in request.headers
                         else "the one sent does not match")},
            status_code=401, headers={"WWW-Authenticate": 'Bearer realm="asyncrl-control"'})


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["MAX_TOKEN_BYTES", "ControlToken"]
