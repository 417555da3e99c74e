"""The rules every HTTP request of the project follows, to its own vLLM servers and to endpoints alike.

- Loopback goes direct: with http_proxy set, urllib would send a request for 127.0.0.1 to the proxy unless
  no_proxy says otherwise, and the project's own servers listen on loopback only.
- An API key stays with the origin (scheme, host, port) it was sent to: urllib's redirect handler copies every
  header onto the redirected request, so a 30x would hand the key to any host. A keyed request is redirected
  only within its origin; elsewhere the 30x is the answer, and the caller names where it pointed. Refusing
  rather than dropping the header (as `requests` does) because a keyless request to another host only ends in
  a 401 that hides the cause.
- A key never crosses the network in clear: plain http:// with a key is refused unless the host is loopback.
- A request ends by `timeout_s` in all: urllib's timeout applies per socket operation, so a server that drips
  a byte at a time would hold a request forever. A timer shuts the request's sockets down at its deadline.
- An answer is read up to MAX_BODY_BYTES, an error's body up to ERROR_BODY_BYTES.
- 429 and 503 with Retry-After: the request is sent again after the wait the server asked for, when that wait
  is at most MAX_RETRY_AFTER_S and ends before the deadline (at most RETRY_AFTER_TRIES times); otherwise the
  error goes to the caller, whose own retries apply.

Standard library only: vllm_runtime imports nothing else of blockdraft.
"""

from __future__ import annotations

import email.utils
import http.client
import io
import ipaddress
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Dict, Mapping, NamedTuple, Optional
from urllib.parse import urlsplit

# Generous: the largest answers are a capture's prompt_logprobs (top-k of every prompt token, ~100 bytes per
# candidate): 32k tokens x 64 candidates fit. What a server sends beyond it is broken, not data.
MAX_BODY_BYTES = 512 * 2**20
ERROR_BODY_BYTES = 4096  # an error page is read for its first lines only
MAX_RETRY_AFTER_S = 60.0
RETRY_AFTER_TRIES = 3
READ_CHUNK = 2**20


class KeyInTheClear(ValueError):
    """A request would carry an API key over plain http to a host that is not loopback."""


class AnswerTooLarge(RuntimeError):
    """The answer exceeded the size cap; nothing of it is kept."""


class DeadlineExceeded(TimeoutError):
    """The request did not end within its total timeout."""


class Answer(NamedTuple):
    status: int
    body: bytes


class HiddenKeyHeaders(dict):
    """Request headers whose Authorization value never shows in a repr, a log line or a traceback's locals."""

    def __repr__(self) -> str:
        return repr({k: ("<hidden>" if k.lower() == "authorization" else v) for k, v in self.items()})

    __str__ = __repr__


def is_loopback(host: Optional[str]) -> bool:
    if not host:
        return False
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def origin(url: str) -> tuple:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def carries_key(headers: Optional[Mapping[str, str]]) -> bool:
    return any(k.lower() == "authorization" for k in (headers or {}))


def check_key_transport(url: str, headers: Optional[Mapping[str, str]]) -> None:
    """Raises KeyInTheClear, naming the fix, where a key would go to a remote host unencrypted."""
    parts = urlsplit(url)
    if carries_key(headers) and parts.scheme == "http" and not is_loopback(parts.hostname):
        host, port = parts.hostname, parts.port or 80
        raise KeyInTheClear(
            f"{url} is plain http:// on another machine: the API key would cross the network unencrypted, so it "
            f"is not sent; serve it over https:// (a TLS proxy in front of it), or tunnel it here "
            f"(ssh -N -L {port}:127.0.0.1:{port} {host}) and use http://127.0.0.1:{port}")


def fetch(url: str, *, data: Optional[bytes] = None, headers: Optional[Mapping[str, str]] = None, timeout_s: float,
          method: Optional[str] = None, max_bytes: Optional[int] = None) -> Answer:
    """The answer (a 2xx status and its body) to one request, under the rules above. Raises urllib.error.HTTPError (its body
    the first ERROR_BODY_BYTES), DeadlineExceeded, AnswerTooLarge, KeyInTheClear, or what the connection
    raised (URLError, OSError, http.client.HTTPException)."""
    check_key_transport(url, headers)
    max_bytes = MAX_BODY_BYTES if max_bytes is None else max_bytes
    deadline = time.monotonic() + timeout_s
    waited = 0
    while True:
        try:
            return _once(url, data, dict(headers or {}), method, deadline, timeout_s, max_bytes)
        except urllib.error.HTTPError as err:
            wait = retry_after_s(err.headers) if err.code in (429, 503) else None
            if wait is None or wait > MAX_RETRY_AFTER_S or waited >= RETRY_AFTER_TRIES \
                    or time.monotonic() + wait >= deadline:
                raise
            waited += 1
            time.sleep(wait)


def retry_after_s(headers) -> Optional[float]:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date); None where absent or unreadable."""
    value = (headers.get("Retry-After") if headers is not None else None) or ""
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _once(url: str, data: Optional[bytes], headers: Dict[str, str], method: Optional[str], deadline: float,
          timeout_s: float, max_bytes: int) -> Answer:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(f"no full answer from {url} within {timeout_s:g} s")
    watch = _Watch()
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    timer = threading.Timer(left, watch.fire)
    timer.daemon = True
    timer.start()
    try:
        with opener_for(url, watch).open(request, timeout=left) as response:
            answer = Answer(response.status, _read_capped(response, max_bytes, url))
    except urllib.error.HTTPError as err:
        if watch.fired:
            raise DeadlineExceeded(f"no full answer from {url} within {timeout_s:g} s") from None
        raise _capped_http_error(err) from None
    except AnswerTooLarge:
        raise
    except (OSError, http.client.HTTPException, ValueError):
        if watch.fired:  # the timer cut the socket: whatever the read raised, the cause is the deadline
            raise DeadlineExceeded(f"no full answer from {url} within {timeout_s:g} s") from None
        raise
    finally:
        timer.cancel()
    if watch.fired:  # a close-delimited answer cut at the deadline reads as a short, complete one
        raise DeadlineExceeded(f"no full answer from {url} within {timeout_s:g} s")
    return answer


def _read_capped(response, max_bytes: int, url: str) -> bytes:
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise AnswerTooLarge(f"{url} announced an answer of {int(declared)} bytes, over the {max_bytes}-byte cap")
    chunks, total = [], 0
    while True:
        chunk = response.read(READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise AnswerTooLarge(f"{url} sent an answer over the {max_bytes}-byte cap; it is not read further")
        chunks.append(chunk)


def _capped_http_error(err: urllib.error.HTTPError) -> urllib.error.HTTPError:
    try:
        detail = err.read(ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        detail = b""
    finally:
        err.close()
    return urllib.error.HTTPError(err.url, err.code, err.msg, err.headers, io.BytesIO(detail))


# --- the opener -----------------------------------------------------------------------------------
def opener_for(url: str, watch: Optional["_Watch"] = None) -> urllib.request.OpenerDirector:
    """An opener under the rules: no proxy for loopback (the environment's proxies elsewhere), keyed redirects
    kept to their origin, and every connection's socket known to `watch`."""
    proxies = urllib.request.ProxyHandler({}) if is_loopback(urlsplit(url).hostname) else urllib.request.ProxyHandler()
    handlers = [proxies, _OriginRedirects()]
    if watch is not None:
        handlers += [_WatchedHTTPHandler(watch), _WatchedHTTPSHandler(watch)]
    return urllib.request.build_opener(*handlers)


class _OriginRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        keyed = req.get_header("Authorization") is not None or "Authorization" in req.unredirected_hdrs
        if keyed and origin(newurl) != origin(req.full_url):
            return None  # not followed: the 30x itself is raised as an HTTPError
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Watch:
    """The sockets of one request, shut down at once when its deadline fires."""

    def __init__(self):
        self.fired = False
        self._sockets = []
        self._lock = threading.Lock()

    def add(self, sock) -> None:
        with self._lock:
            self._sockets.append(sock)
            late = self.fired
        if late:
            _shut(sock)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # a blocked recv in the request's thread returns at once
    except OSError:
        pass


class _WatchedHTTPConnection(http.client.HTTPConnection):
    watch: _Watch

    def connect(self):
        super().connect()
        self.watch.add(self.sock)


class _WatchedHTTPSConnection(http.client.HTTPSConnection):
    watch: _Watch

    def connect(self):
        super().connect()
        self.watch.add(self.sock)


def _watched(cls, watch: _Watch):
    def make(*args, **kwargs):
        connection = cls(*args, **kwargs)
        connection.watch = watch
        return connection

    return make


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch

    def http_open(self, req):
        return self.do_open(_watched(_WatchedHTTPConnection, self.watch), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch

    def https_open(self, req):
        return self.do_open(_watched(_WatchedHTTPSConnection, self.watch), req, context=self._context)
