"""Who may talk to `glmstack serve`, and from where: API key, Host, Origin, content type, body size (issue 34).

Why: the server is reachable by every web page its user opens, not only by the clients meant for it. A page cannot
read a cross-origin reply, but it can send a "simple" request (a `Content-Type: text/plain` POST needs no CORS
preflight), so without these checks any page could push weights or queue work; and with DNS rebinding
(evil.example resolving to 127.0.0.1) the page's requests are same-origin to the browser and it reads the replies,
unless the server refuses a `Host` that is not its own. What each check does, in order, as a plain ASGI middleware
(no per-request allocation beyond the headers; the throughput bench is unchanged):

    Host        a server bound to a loopback address takes only loopback names (localhost, 127.0.0.1, [::1]) unless
                --allowed-hosts names others ("*": any); bound elsewhere, --allowed-hosts if given      -> 403
    API key     every route but /health needs `Authorization: Bearer KEY` when --api-key (or
                GLMSTACK_API_KEY) is set; compared in constant time                                       -> 401
    POST        must be `Content-Type: application/json` (a browser cannot send that cross-site without a
                preflight this server never answers), and an `Origin` header, when present, must be
                the server's own (scheme://Host)                                                           -> 415 / 403
    body        at most Limits.max_body_bytes: a larger Content-Length is refused before reading; a body sent
                without one is counted as it arrives                                                      -> 413

    app = Guard(app, api_key="...", bind_host="127.0.0.1", allowed_hosts=None, max_body_bytes=4 << 20)
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from urllib.parse import urlsplit

from glmstack.serve.protocol import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
OPEN_PATHS = frozenset({"/health"})  # load balancers and orchestrators probe it without credentials


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """'Host' header value -> the name without the port ('[::1]:8000' -> '::1')."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    def __init__(self, app, *, api_key: str | None = None, bind_host: str = "127.0.0.1",
                 allowed_hosts: list[str] | None = None, max_body_bytes: int = 4 << 20):  # fmt: skip
        self.app, self.api_key, self.max_body = app, api_key or None, max_body_bytes
        self._expected = f"Bearer {api_key}".encode() if api_key else b""
        if allowed_hosts:
            self.hosts = None if "*" in allowed_hosts else {host_name(h) for h in allowed_hosts}
        else:  # loopback-bound: loopback names only (DNS rebinding); bound elsewhere: the names are not known here
            self.hosts = "loopback" if is_loopback(bind_host) else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await _answer(send, *refusal)
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _answer(send, 413, f"the request body is larger than this server's limit of "
                                 f"{self.max_body} bytes (glmstack serve --max-body-mb)")  # fmt: skip
        if length is None:  # chunked: read it here, counting, and hand the app the whole body
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.max_body:
                    return await _answer(send, 413, f"the request body is larger than this server's limit of "
                                         f"{self.max_body} bytes (glmstack serve --max-body-mb)")  # fmt: skip
            receive = _replay(body, receive)
        return await self.app(scope, receive, send)

    def _refusal(self, scope, headers: dict) -> tuple[int, str] | None:
        host = host_name(headers.get("host", b"").decode("latin-1"))
        if (self.hosts == "loopback" and not is_loopback(host)) or (isinstance(self.hosts, set) and host not in self.hosts):
            return 403, (f"Host {host!r} is not allowed: this server answers only to its own names "
                         "(glmstack serve --allowed-hosts)")  # fmt: skip
        if self.api_key and scope["path"] not in OPEN_PATHS:
            given = headers.get("authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                return 401, "a valid API key is required: send the header 'Authorization: Bearer <key>'"
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return None
        ctype = headers.get("content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if ctype != "application/json":
            return 415, f"request bodies must be 'Content-Type: application/json', got {ctype or 'none'!r}"
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin.decode("latin-1"), scope, headers):
            return 403, "cross-origin requests are refused: the Origin is not this server's"
        return None


def _same_origin(origin: str, scope, headers: dict) -> bool:
    parts = urlsplit(origin)
    own = headers.get("host", b"").decode("latin-1").lower()
    return parts.scheme == scope.get("scheme", "http") and parts.netloc.lower() == own


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the server's own receive does

    return replay


async def _answer(send, status: int, message: str) -> None:
    body = json.dumps(ApiError(status, message).body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
