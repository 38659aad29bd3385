"""The browser half of Claude Code's interactive ``/login``, for the tests: the program ``$BROWSER`` names.

``python -m tests.login_browser URL`` (or this file as a script; standard library only, so any Python 3.11 runs
it) does with an HTTP client what a user's browser does with the verification link the CLI opens:

1. ``GET URL`` (the ``verification_uri_complete``) and parse its form (:class:`FormParser`): the form's action,
   its hidden and text inputs (the CSRF token, ``user_code``) and its submit buttons (``name="action"``,
   ``value="continue"`` / ``"deny"``);
2. ``POST`` the fields with the pressed button's name and value, as a browser sends a same-origin form:
   ``Origin`` (the page's origin), ``Referer`` (the page's URL), ``Sec-Fetch-Site: same-origin``;
3. follow every redirect by hand (301/302/303 as ``GET``, 307/308 re-sent as they came), through the identity
   provider's authorize endpoint and back to the gateway's ``/oauth/callback``, keeping cookies per host as a
   browser does (``http.cookiejar``).

Every URL it opens, the first included, must be on loopback (``127.0.0.1``, ``localhost``, ``::1``): anything
else is refused before a byte is sent, and the program exits 2. It exits 0 only when the last answer is a 2xx,
else 1 (an HTTP error, a page with no form, no such button, too many redirects, a network error).

Environment: ``LOGIN_BROWSER_ACTION`` (``continue`` by default; ``deny`` presses Deny); ``LOGIN_BROWSER_LOG``, a
file to which each step is appended as one line (the test's diagnostics: the CLI discards a browser's output).
"""

from __future__ import annotations

import http.client
import http.cookiejar
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import Message
from html.parser import HTMLParser

__all__ = [
    "ENV_ACTION",
    "ENV_LOG",
    "BrowserError",
    "BrowserResult",
    "FormParser",
    "HtmlForm",
    "is_loopback",
    "main",
    "open_verification",
]

ENV_ACTION = "LOGIN_BROWSER_ACTION"
ENV_LOG = "LOGIN_BROWSER_LOG"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_REDIRECTS = 10
TIMEOUT_S = 20.0
USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) messages-gateway-tests/login_browser"
_REDIRECTS = (301, 302, 303, 307, 308)
# Input types a form submission sends by value (checkboxes and radios only when checked; files never).
_SKIPPED_INPUTS = frozenset({"submit", "button", "image", "reset", "file"})


class BrowserError(Exception):
    """The browser half failed; ``refused`` when a URL was not on loopback (nothing was sent to it)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def is_loopback(url: str) -> bool:
    """An ``http``/``https`` URL whose host is 127.0.0.1, localhost or ::1."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and (parts.hostname or "").lower() in LOOPBACK_HOSTS


def _require_loopback(url: str) -> None:
    if not is_loopback(url):
        raise BrowserError(f"refusing to open {url!r}: the test browser only opens loopback URLs", refused=True)


@dataclass
class HtmlForm:
    """One ``<form>``: its method and action as written, the inputs it submits, its submit buttons."""

    method: str = "get"
    action: str = ""
    fields: list[tuple[str, str]] = field(default_factory=list)
    buttons: list[tuple[str, str]] = field(default_factory=list)  # (name, value) of each named submit button

    def button(self, value: str) -> tuple[str, str] | None:
        """The submit button whose value is ``value`` (case-insensitive), as (name, value)."""
        for name, val in self.buttons:
            if val.lower() == value.lower():
                return name, val
        return None


class FormParser(HTMLParser):
    """Every ``<form>`` of a page (``forms``), in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[HtmlForm] = []
        self._current: HtmlForm | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k.lower(): (v if v is not None else "") for k, v in attrs}
        if tag == "form":
            self._current = HtmlForm(method=(a.get("method") or "get").lower(), action=a.get("action", ""))
            self.forms.append(self._current)
            return
        form = self._current
        if form is None:
            return
        name = a.get("name", "")
        if tag == "button":
            if (a.get("type") or "submit").lower() == "submit" and name:
                form.buttons.append((name, a.get("value", "")))
        elif tag == "input" and name:
            kind = (a.get("type") or "text").lower()
            if kind in ("submit", "image"):
                form.buttons.append((name, a.get("value", "")))
            elif kind in _SKIPPED_INPUTS or (kind in ("checkbox", "radio") and "checked" not in a):
                return
            else:
                form.fields.append((name, a.get("value", "on" if kind in ("checkbox", "radio") else "")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None


@dataclass
class BrowserResult:
    """How the browser half ended: the last answer's status, URL and body, and every URL opened, in order."""

    status: int
    url: str
    body: str
    visited: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects come back as answers (``HTTPError``), to be checked and followed by hand."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: object,
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


@dataclass
class _Answer:
    status: int
    url: str
    headers: Message
    body: str


class _Browser:
    def __init__(self, log: Callable[[str], None], timeout: float) -> None:
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirects())
        self.log = log
        self.timeout = timeout

    def send(self, method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> _Answer:
        _require_loopback(url)
        sent = {"User-Agent": USER_AGENT, "Accept": "text/html,application/xhtml+xml,*/*;q=0.8", **(headers or {})}
        request = urllib.request.Request(url, data=data, headers=sent, method=method)
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                answer = _Answer(response.status, url, response.headers, _text(response.read()))
        except urllib.error.HTTPError as exc:  # any non-2xx, redirects included
            answer = _Answer(exc.code, url, exc.headers, _text(exc.read()))
        except (OSError, http.client.HTTPException) as exc:
            raise BrowserError(f"{method} {url}: {exc!r}") from exc
        cookies = sorted(f"{c.domain}:{c.name}" for c in self.jar)
        self.log(f"{method} {url} -> {answer.status} location={answer.headers.get('Location')!r} cookies={cookies}")
        return answer


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _choose_form(forms: Sequence[HtmlForm], action: str) -> HtmlForm | None:
    for form in forms:
        if form.button(action) is not None:
            return form
    return None


def open_verification(
    url: str,
    *,
    action: str = "continue",
    log: Callable[[str], None] | None = None,
    timeout: float = TIMEOUT_S,
    user_code: str | None = None,
    headers: dict[str, str] | None = None,
) -> BrowserResult:
    """Open the verification link ``url``, press the form's submit button whose value is ``action``, follow the
    redirects to the end. ``user_code`` replaces the code the page pre-filled; ``headers`` replace the browser's
    ``Origin``/``Referer``/``Sec-Fetch-*`` on the form's request (the tests of the CSRF guard). Raises
    :class:`BrowserError` when a URL is not on loopback, the page has no form with such a button, a request fails
    on the network, or there are more than :data:`MAX_REDIRECTS` redirects; an HTTP error answer ends it normally
    (``result.ok`` False)."""
    say = log or (lambda _line: None)
    browser = _Browser(say, timeout)
    visited = [url]
    page = browser.send("GET", url)
    if page.status != 200:
        return BrowserResult(page.status, url, page.body, visited)
    parser = FormParser()
    parser.feed(page.body)
    parser.close()
    form = _choose_form(parser.forms, action)
    if form is None:
        raise BrowserError(f"{url}: no form with a submit button {action!r} in the page: {page.body[:500]!r}")
    pressed = form.button(action)
    assert pressed is not None
    fields = [*form.fields, pressed]
    if user_code is not None:
        fields = [(name, user_code if name == "user_code" else value) for name, value in fields]
    say(f"form method={form.method} action={form.action!r} fields={[name for name, _ in fields]} pressed={pressed}")
    target = urllib.parse.urljoin(url, form.action or url)
    origin = urllib.parse.urlsplit(url)
    sent = {
        "Origin": f"{origin.scheme}://{origin.netloc}",
        "Referer": url,
        "Sec-Fetch-Site": "same-origin",
        "Sec-Fetch-Mode": "navigate",
        "Sec-Fetch-Dest": "document",
    }
    if headers is not None:
        sent = dict(headers)
    encoded = urllib.parse.urlencode(fields)
    if form.method == "post":
        method, data = "POST", encoded.encode()
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    else:
        method, data = "GET", None
        target = urllib.parse.urlunsplit(urllib.parse.urlsplit(target)._replace(query=encoded, fragment=""))
    visited.append(target)
    answer = browser.send(method, target, data, sent)
    hops = 0
    while answer.status in _REDIRECTS:
        hops += 1
        location = answer.headers.get("Location")
        if not location:
            raise BrowserError(f"{answer.url}: a {answer.status} without a Location")
        if hops > MAX_REDIRECTS:
            raise BrowserError(f"more than {MAX_REDIRECTS} redirects: {visited}")
        following = urllib.parse.urljoin(answer.url, location)
        visited.append(following)
        if answer.status in (307, 308):  # the same method and body, as a browser re-sends them
            answer = browser.send(method, following, data, sent if data is not None else None)
        else:
            method, data = "GET", None
            answer = browser.send("GET", following)
    return BrowserResult(answer.status, answer.url, answer.body, visited)


def _logger(path: str | None) -> Callable[[str], None]:
    def log(line: str) -> None:
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{time.strftime('%H:%M:%S')} [{os.getpid()}] {line}\n")

    return log


def main(argv: Sequence[str] | None = None) -> int:
    """``login_browser URL``: 0 when the browser half ended on a 2xx, 1 when it failed, 2 for a usage error or a
    URL that is not on loopback."""
    args = list(sys.argv[1:] if argv is None else argv)
    log = _logger(os.environ.get(ENV_LOG))
    log(f"argv={args!r}")
    if len(args) != 1:
        log("usage: login_browser URL")
        print("usage: python -m tests.login_browser URL", file=sys.stderr)
        return 2
    action = os.environ.get(ENV_ACTION) or "continue"
    try:
        result = open_verification(args[0], action=action, log=log)
    except BrowserError as exc:
        log(f"error: {exc}")
        print(f"login_browser: {exc}", file=sys.stderr)
        return 2 if exc.refused else 1
    log(f"done: {result.status} at {result.url} ({'ok' if result.ok else 'failed'}) body={result.body[:300]!r}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
