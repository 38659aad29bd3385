"""The browser half of Claude Code's ``/login``, done with an HTTP client, for the tests: open the verification
link, press Continue (or Deny) on the gateway's page as a browser would send it (its cookies, ``Origin``,
``Referer``, ``Sec-Fetch-Site``), follow the redirects through the identity provider and back to the gateway's
callback. Only loopback URLs: a test never sends a browser anywhere else."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx

__all__ = ["BrowserResult", "FormParser", "sign_in_in_browser"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class FormParser(HTMLParser):
    """The first form of a page: its method and action, its inputs' names and values, its submit buttons."""

    def __init__(self) -> None:
        super().__init__()
        self.method = ""
        self.action = ""
        self.fields: dict[str, str] = {}
        self.buttons: dict[str, str] = {}  # value -> name
        self.scripts = 0
        self._forms = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "script":
            self.scripts += 1
        if tag == "form":
            self._forms += 1
            if self._forms == 1:
                self.method, self.action = a.get("method", "get").lower(), a.get("action", "")
        elif tag == "input" and self._forms == 1 and a.get("name"):
            self.fields[a["name"]] = a.get("value", "")
        elif tag == "button" and self._forms == 1 and a.get("name"):
            self.buttons[a.get("value", "")] = a["name"]


@dataclass
class BrowserResult:
    status: int  # the last answer's
    body: str
    visited: list[str] = field(default_factory=list)
    page: FormParser | None = None


def _loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in _LOOPBACK:
        raise ValueError(f"the test browser only opens loopback URLs, not {url!r}")


def sign_in_in_browser(
    url: str,
    *,
    action: str = "continue",
    user_code: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> BrowserResult:
    """Open ``url`` (the ``verification_uri_complete``), submit its form with ``action``, follow every redirect
    (each on loopback) to the end. ``user_code`` replaces the pre-filled code; ``headers`` replace the browser's
    ``Origin``/``Referer``/``Sec-Fetch-Site`` on the POST (a test of the CSRF guard)."""
    _loopback(url)
    visited = [url]
    with httpx.Client(timeout=timeout, follow_redirects=False) as browser:
        page = browser.get(url)
        form = FormParser()
        form.feed(page.text)
        if page.status_code != 200 or not form.action:
            return BrowserResult(page.status_code, page.text, visited, form)
        target = urljoin(str(page.url), form.action)
        _loopback(target)
        fields = dict(form.fields)
        if user_code is not None:
            fields["user_code"] = user_code
        if action in form.buttons:
            fields[form.buttons[action]] = action
        parts = urlsplit(str(page.url))
        sent = {"origin": f"{parts.scheme}://{parts.netloc}", "referer": str(page.url), "sec-fetch-site": "same-origin"}
        if headers is not None:
            sent = headers
        answer = browser.post(target, data=fields, headers=sent)
        visited.append(target)
        while answer.status_code in (301, 302, 303, 307, 308):
            location = urljoin(str(answer.url), answer.headers["location"])
            _loopback(location)
            visited.append(location)
            answer = browser.get(location)
        return BrowserResult(answer.status_code, answer.text, visited, form)
