"""Claude Code's interactive ``/login`` to a gateway, driven unattended for the tests: the real CLI
(``tests/claude_cli.py``) in a private tmux server, its browser half done by ``tests/login_browser.py``.

:func:`claude_login` does it all for a fresh HOME::

    gateway = claude_login(cli, "http://127.0.0.1:PORT", tmp_path / "home")
    # gateway == {"url", "jwt", "expiresAt", "tokenEndpoint", "revocationEndpoint"?, "idpRefreshToken"?,
    #             "email"?, "vouchedAtLogin"}: ~/.claude/.credentials.json -> enterpriseGateway

and afterwards ``run_claude(cli, "say hi", env={}, home=home, settings=None)`` runs through the gateway with that
sign-in. The parts, for tests that want to look at the screens or keep the TUI open:

* :func:`prepare_home`: ``~/.claude.json`` (onboarding done, the working folder trusted) and
  ``~/.claude/settings.json`` (``forceLoginMethod: gateway``, ``forceLoginGatewayUrl``, plus any settings);
* :func:`write_browser_script`: the ``$BROWSER`` program (``python -m tests.login_browser URL``, its log file and
  the button it presses baked in);
* :class:`ClaudeTui`: the CLI in ``tmux -L <unique socket> new-session -d -x 180 -y 50`` (never the user's own
  tmux server; the server is killed in :meth:`ClaudeTui.close`), its screen (``capture-pane``), keys, menus;
* :func:`sign_in`: ``/login`` on a running TUI, step by step on what the screen shows.

What the CLI (2.1.332) shows, in order, and what :func:`sign_in` answers (captured against a stub gateway;
``>`` below stands for the menu cursor U+276F, which is also the prompt's mark at column 0):

1. the prompt (under a rule): type ``/login``, Enter (again if it stays typed: the first presses may be lost);
2. ``Gateway URL from your settings file … Gateway:  <url> · Enter to connect · Esc to go back``: Enter;
3. ``Trust gateway 127.0.0.1? … Certificate fingerprint (SHA-256): http-loopback… / Yes, trust this gateway /
   > No, cancel login`` (No is preselected: Up, then Enter) — asked once per HOME (``gatewayTrust`` in
   ``.credentials.json``);
4. ``A browser window should have opened. … Code:  XXXX-XXXX … ✶ Waiting for sign-in to complete in your
   browser…`` (``Notice from <host>: │ <login_notice>``): nothing to press; ``$BROWSER`` runs meanwhile;
5. ``Signed in to Cloud gateway as <email> … Yes, continue / > No, cancel login`` (when the token answer has an
   ``email``; No preselected): Up, Enter;
6. ``✔ Connected to Cloud gateway · Press Enter to continue``: Enter;
7. (a policy with settings that need approval, e.g. ``env``) ``⎿ Signed in. Review your organization's managed
   settings to continue.`` then ``Managed settings require approval … Settings requiring approval: · NAME …
   > No, exit Claude Code / Yes, I trust these settings``: Down, Enter (at a later start the same dialog lists
   ``> 1. Yes, I trust these settings / 2. No, exit Claude Code``: :meth:`ClaudeTui.choose` moves by the text);
8. the prompt again (``Opus … · Cloud gateway`` in the header): ``/exit``.

A failed sign-in shows a ``✘`` line in the Login panel (``✘ Sign-in was denied in the browser.``) and ``Esc to
cancel``: :func:`sign_in` raises :class:`LoginError` with that text (``error.failure``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.claude_cli import CLAUDE_CODE_VERSION, DEFAULT_SETTINGS, QUIET_ENV

__all__ = [
    "ENV_REQUIRE_TMUX",
    "ClaudeTui",
    "LoginError",
    "claude_login",
    "find_tmux",
    "prepare_home",
    "read_credentials",
    "sign_in",
    "write_browser_script",
]

ENV_REQUIRE_TMUX = "MESSAGES_GATEWAY_REQUIRE_TMUX"  # set by .ci/run where tmux is installed: a missing tmux fails
REPO = Path(__file__).resolve().parents[1]
HARNESS_DIR = ".login-harness"  # inside the HOME: the browser script, its log, tmux's config
WIDTH, HEIGHT = 180, 50
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ")

# Screen texts of CLI 2.1.332's /login (see the module docstring).
ENTER_TO_CONNECT = "Enter to connect"
TRUST_TITLE = "Trust gateway"
TRUST_YES = "Yes, trust this gateway"
CANCEL_LOGIN = "No, cancel login"
WAITING = "Waiting for sign-in"
ACCOUNT_TITLE = "Signed in to "
ACCOUNT_YES = "Yes, continue"
CONNECTED = "Connected to"
PRESS_ENTER = "Press Enter to continue"
REVIEW_MANAGED = "Review your organization's managed settings"
MANAGED_TITLE = "Managed settings require approval"
MANAGED_YES = "Yes, I trust these settings"
MANAGED_NO = "No, exit Claude Code"
PROMPT = "\u276f"  # the prompt, and the menus' cursor (indented)
_MENU_CURSOR = re.compile(r"^\s+\u276f\s")
_FAILURE = re.compile(r"^\s*✘\s*(?P<text>.+?)\s*$", re.MULTILINE)
_CODE = re.compile(r"Code:\s+(?P<code>[A-Z0-9]{4,}(?:-[A-Z0-9]{4,})*)")
_ACCOUNT = re.compile(r"Signed in to .+? as (?P<email>\S+)")


class LoginError(AssertionError):
    """The sign-in did not complete: why, the last screen, the browser's log and the steps taken.
    ``failure`` is the CLI's own ``✘`` line when it showed one (e.g. ``Sign-in was denied in the browser.``)."""

    def __init__(self, message: str, *, screen: str = "", failure: str | None = None) -> None:
        super().__init__(message)
        self.screen = screen
        self.failure = failure


def find_tmux() -> Path | None:
    """tmux on PATH (``/usr/bin/tmux`` on Debian), or None."""
    found = shutil.which("tmux")
    return Path(found) if found else None


def read_credentials(home: Path) -> dict[str, Any]:
    """``HOME/.claude/.credentials.json`` parsed (``{}`` when missing or unreadable)."""
    path = home / ".claude" / ".credentials.json"
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def prepare_home(
    home: Path,
    gateway_url: str | None,
    *,
    settings: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
) -> Path:
    """Make ``home`` a fresh CLI HOME for a gateway sign-in and return the working folder (``home/work`` unless
    given): ``~/.claude.json`` with onboarding done and that folder trusted, ``~/.claude/settings.json`` with
    :data:`tests.claude_cli.DEFAULT_SETTINGS`, ``forceLoginMethod: gateway`` and ``forceLoginGatewayUrl`` (when
    ``gateway_url`` is not None), then ``settings`` on top (a key mapped to None is removed), and ``home/tmp``."""
    work = workdir or home / "work"
    for folder in (home / ".claude", work, home / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)
    state = {
        "hasCompletedOnboarding": True,
        "lastOnboardingVersion": CLAUDE_CODE_VERSION,
        "theme": "dark",
        "projects": {str(work): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
    }
    (home / ".claude.json").write_text(json.dumps(state, indent=2))
    merged: dict[str, Any] = dict(DEFAULT_SETTINGS)
    if gateway_url is not None:
        merged.update({"forceLoginMethod": "gateway", "forceLoginGatewayUrl": gateway_url})
    for key, value in (settings or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    (home / ".claude" / "settings.json").write_text(json.dumps(merged, indent=2))
    return work


def write_browser_script(
    path: Path,
    *,
    log: Path,
    action: str = "continue",
    python: str = sys.executable,
) -> Path:
    """Write the ``$BROWSER`` program at ``path`` (executable ``sh``): ``python -m tests.login_browser URL`` run
    from this checkout, with ``LOGIN_BROWSER_LOG=log`` and ``LOGIN_BROWSER_ACTION=action`` set inside it (so they
    do not depend on the CLI passing its environment on)."""
    q = shlex.quote
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        "# $BROWSER for Claude Code's /login in a test: the browser half over HTTP, loopback only.\n"
        f"LOGIN_BROWSER_LOG={q(str(log))}; export LOGIN_BROWSER_LOG\n"
        f"LOGIN_BROWSER_ACTION={q(action)}; export LOGIN_BROWSER_ACTION\n"
        f"cd {q(str(REPO))} || exit 1\n"
        f'exec {q(python)} -m tests.login_browser "$@"\n'
    )
    path.chmod(0o755)
    return path


def _is_rule(line: str) -> bool:
    text = line.strip()
    return len(text) >= 20 and set(text) == {"─"}


def input_line(screen: str) -> str | None:
    """What is typed in the prompt (:data:`PROMPT` at column 0 right under a rule), or None when no prompt
    shows (a dialog has the screen)."""
    lines = screen.splitlines()
    for i in range(len(lines) - 1, 0, -1):
        if lines[i].startswith(PROMPT) and _is_rule(lines[i - 1]):
            return lines[i][1:].strip()
    return None


def menu_offset(screen: str, option: str) -> int | None:
    """How many lines the menu cursor (an indented :data:`PROMPT`) must move to reach the option whose text contains
    ``option`` (negative: up), or None when the option or a cursor near it is not on the screen."""
    lines = screen.splitlines()
    targets = [i for i, line in enumerate(lines) if option in line]
    if not targets:
        return None
    target = targets[-1]
    cursors = [i for i, line in enumerate(lines) if _MENU_CURSOR.match(line) and abs(i - target) <= 8]
    if not cursors:
        return None
    cursor = min(cursors, key=lambda i: abs(i - target))
    return target - cursor


class ClaudeTui:
    """The real CLI, interactive, in a tmux server of its own (``tmux -L <unique socket>``, no user config,
    ``remain-on-exit`` so the last screen of a CLI that quit can still be read). Use as a context manager, or call
    :meth:`start` and :meth:`close` (which kills the tmux server and the CLI's process group)."""

    def __init__(
        self,
        cli: Path,
        home: Path,
        *,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        workdir: Path | None = None,
        tmux: Path | None = None,
        width: int = WIDTH,
        height: int = HEIGHT,
    ) -> None:
        found = tmux or find_tmux()
        if found is None:
            raise RuntimeError("tmux is not installed (apt-get install tmux)")
        self.tmux = found
        self.cli = cli
        self.home = home
        self.workdir = workdir or home / "work"
        self.env = dict(env or {})
        self.args = list(args)
        self.width, self.height = width, height
        self.socket = f"mgw-claude-{os.getpid()}-{secrets.token_hex(4)}"
        self.session = "claude"
        self.pid: int | None = None  # the CLI's (the pane's process, leader of its process group)
        self.socket_path: Path | None = None
        self.steps: list[str] = []  # what was done and seen, for assertion messages

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> ClaudeTui:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def full_env(self) -> dict[str, str]:
        """The CLI's whole environment: PATH and the locale from this process, a HOME of its own (XDG folders and
        TMPDIR inside it), :data:`tests.claude_cli.QUIET_ENV`, ``TERM``, then ``env``."""
        home = self.home
        inherited = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        return {
            "LANG": "C.UTF-8",
            **inherited,
            "HOME": str(home),
            "USERPROFILE": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "TMPDIR": str(home / "tmp"),
            "TERM": "xterm-256color",
            **QUIET_ENV,
            **self.env,
        }

    def _tmux(self, *args: str, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
        return subprocess.run(
            [str(self.tmux), "-u", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )

    def start(self) -> None:
        """Start the CLI (``env -i <full_env> cli *args``) in a detached ``WIDTH``x``HEIGHT`` session."""
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.home / HARNESS_DIR / "tmux.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 5000\nset -g status off\n")
        command = ["env", "-i", *(f"{k}={v}" for k, v in self.full_env().items()), str(self.cli), *self.args]
        self._tmux(
            "-f",
            str(conf),
            "new-session",
            "-d",
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            "-s",
            self.session,
            "-c",
            str(self.workdir),
            *command,
        )
        out = self._tmux("display-message", "-p", "-t", self.session, "#{pane_pid} #{socket_path}", check=False)
        pid, _, socket_path = out.stdout.strip().partition(" ")
        with contextlib.suppress(ValueError):
            self.pid = int(pid)
        self.socket_path = Path(socket_path) if socket_path else None
        self.steps.append(f"started {self.cli} (pid {self.pid}) in tmux -L {self.socket}")

    def close(self) -> None:
        """Kill the tmux server, then the CLI's process group if it outlived it. Safe to call twice."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self._tmux("kill-server", check=False)
        if self.socket_path is not None:  # kill-server leaves the socket file behind
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
            self.socket_path = None
        if self.pid is not None:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and _alive(self.pid):
                time.sleep(0.1)
            if _alive(self.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
            self.pid = None

    # -- the screen and the keys -------------------------------------------------------------------------------

    def screen(self) -> str:
        """The visible pane (wrapped lines joined, trailing blanks dropped); "" when tmux no longer answers."""
        try:
            out = self._tmux("capture-pane", "-p", "-J", "-t", self.session, check=False)
        except (OSError, subprocess.SubprocessError):
            return ""
        return "\n".join(line.rstrip() for line in out.stdout.splitlines()).strip("\n")

    def exited(self) -> bool:
        """The CLI has quit (its pane is dead), or the tmux server is gone."""
        try:
            out = self._tmux("display-message", "-p", "-t", self.session, "#{pane_dead}", check=False)
        except (OSError, subprocess.SubprocessError):
            return True
        return out.returncode != 0 or out.stdout.strip() == "1"

    def keys(self, *keys: str) -> None:
        """tmux key names: ``Enter``, ``Up``, ``Down``, ``Escape``, ``C-c``…"""
        self.steps.append(f"keys {' '.join(keys)}")
        self._tmux("send-keys", "-t", self.session, *keys)

    def type(self, text: str) -> None:
        """Type ``text`` literally (no Enter)."""
        self.steps.append(f"type {text!r}")
        self._tmux("send-keys", "-t", self.session, "-l", text)

    def describe(self, screen: str | None = None) -> str:
        """For assertion messages: the steps, the screen, the browser's log (when the harness wrote one)."""
        shown = self.screen() if screen is None else screen
        log = self.home / HARNESS_DIR / "browser.log"
        browser = log.read_text(errors="replace")[-3000:] if log.exists() else "(none)"
        return (
            "--- steps ---\n" + "\n".join(self.steps[-40:]) + f"\n--- screen ---\n{shown}\n"
            f"--- browser log ---\n{browser}"
        )

    def wait_for(self, *texts: str, timeout: float = 30.0, absent: bool = False) -> str:
        """Wait until the screen shows any of ``texts`` (``absent``: none of them) and return it; a
        :class:`LoginError` with the screen after ``timeout`` s or when the CLI quits."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            found = any(t in screen for t in texts)
            if found != absent:
                return screen
            if self.exited():
                raise LoginError(f"the CLI quit while waiting for {texts!r}\n{self.describe(screen)}", screen=screen)
            if time.monotonic() > deadline:
                what = "the screen to lose" if absent else "the screen to show"
                raise LoginError(f"timed out waiting for {what} {texts!r}\n{self.describe(screen)}", screen=screen)
            time.sleep(0.2)

    def choose(self, option: str, *, timeout: float = 15.0) -> None:
        """Move a menu's cursor onto the option containing ``option`` (arrow keys, checked on the screen) and
        press Enter."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.wait_for(option, timeout=max(0.1, deadline - time.monotonic()))
            offset = menu_offset(screen, option)
            if offset == 0:
                self.keys("Enter")
                return
            if offset is not None:
                self.keys(*(["Down"] * offset if offset > 0 else ["Up"] * -offset))
            if time.monotonic() > deadline:
                raise LoginError(f"could not select {option!r}\n{self.describe(screen)}", screen=screen)
            time.sleep(0.4)

    def command(self, text: str, *, timeout: float = 15.0, retry_s: float = 3.0) -> None:
        """Type ``text`` (a prompt or a slash command) at the prompt and press Enter, again while it stays typed."""
        deadline = time.monotonic() + timeout
        self.wait_for_prompt(timeout=timeout)
        self.type(text)
        time.sleep(0.3)
        self.keys("Enter")
        pressed = time.monotonic()
        while True:
            screen = self.screen()
            if input_line(screen) != text or self.exited():
                return
            if time.monotonic() > deadline:
                raise LoginError(f"{text!r} stayed typed at the prompt\n{self.describe(screen)}", screen=screen)
            if time.monotonic() - pressed > retry_s:
                self.keys("Enter")
                pressed = time.monotonic()
            time.sleep(0.2)

    def wait_for_prompt(self, *, timeout: float = 30.0) -> str:
        """Wait for the prompt (no dialog in front of it) and return the screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if input_line(screen) is not None:
                return screen
            if self.exited():
                raise LoginError(f"the CLI quit before its prompt showed\n{self.describe(screen)}", screen=screen)
            if time.monotonic() > deadline:
                raise LoginError(f"no prompt after {timeout} s\n{self.describe(screen)}", screen=screen)
            time.sleep(0.2)

    def exit(self, *, timeout: float = 20.0) -> bool:
        """``/exit`` and wait for the CLI to quit; True when it did."""
        if self.exited():
            return True
        with contextlib.suppress(LoginError):
            self.command("/exit", timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.exited():
                self.steps.append("the CLI quit")
                return True
            time.sleep(0.2)
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sign_in(
    tui: ClaudeTui,
    *,
    approve_env: bool = True,
    trust_gateway: bool = True,
    timeout: float = 120.0,
    retry_s: float = 3.0,
    attempts: int = 3,
    on_screen: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    """``/login`` on a running TUI whose HOME has ``forceLoginGatewayUrl``, through every step the screen shows
    (the module docstring's list), until the prompt is back after "Connected"; returns the credentials' entry
    ``enterpriseGateway``. A key is pressed again when its screen stays ``retry_s`` s (the CLI may drop the first
    presses); ``/login`` is typed again when the flow ends back at the prompt without connecting, up to
    ``attempts`` times. ``approve_env=False`` answers the managed-settings dialog No (the CLI then quits: the
    credentials are returned as they are); ``trust_gateway=False`` cancels at the trust question (a
    :class:`LoginError`). ``on_screen(step, screen)`` sees each distinct step's screen (a capture's log)."""
    deadline = time.monotonic() + timeout
    acted: dict[str, float] = {}  # step -> when its key was last pressed
    logins = 0
    connected = answered_env = False
    idle_since: float | None = None
    seen: set[str] = set()

    def once(step: str, screen: str) -> bool:
        """True when ``step``'s action is due: first time, or its screen stayed ``retry_s`` s."""
        if step not in seen:
            seen.add(step)
            tui.steps.append(f"screen: {step}")
            if on_screen is not None:
                on_screen(step, screen)
        now = time.monotonic()
        if now - acted.get(step, -1e9) < retry_s:
            return False
        acted[step] = now
        return True

    while True:
        screen = tui.screen()
        if time.monotonic() > deadline:
            raise LoginError(f"/login did not finish in {timeout} s\n{tui.describe(screen)}", screen=screen)
        if tui.exited():
            if not approve_env and answered_env:
                return dict(read_credentials(tui.home).get("enterpriseGateway") or {})
            raise LoginError(f"the CLI quit during /login\n{tui.describe(screen)}", screen=screen)
        prompt = input_line(screen)
        failure = _FAILURE.search(screen) if prompt is None else None  # the Login panel's "✘ …" line
        if failure is not None:
            text = failure.group("text")
            raise LoginError(f"sign-in failed: {text}\n{tui.describe(screen)}", screen=screen, failure=text)
        if MANAGED_TITLE in screen:
            if once("managed settings approval", screen):
                tui.choose(MANAGED_YES if approve_env else MANAGED_NO)
                answered_env = True
        elif TRUST_TITLE in screen and TRUST_YES in screen:
            if once("trust the gateway", screen):
                if not trust_gateway:
                    tui.choose(CANCEL_LOGIN)
                    raise LoginError("declined to trust the gateway", screen=screen)
                tui.choose(TRUST_YES)
        elif ACCOUNT_TITLE in screen and ACCOUNT_YES in screen:
            if once("confirm the account", screen):
                tui.choose(ACCOUNT_YES)
        elif CONNECTED in screen and PRESS_ENTER in screen:
            connected = True
            if once("connected", screen):
                tui.keys("Enter")
        elif ENTER_TO_CONNECT in screen:
            if once("gateway: enter to connect", screen):
                tui.keys("Enter")
        elif WAITING in screen:
            once("waiting for the browser", screen)
            _check_browser(tui, screen)
        elif prompt is not None and connected:
            if answered_env or REVIEW_MANAGED not in screen:  # else the approval dialog is on its way
                # back at the prompt: done once it stays so
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= 1.5:
                    gateway = read_credentials(tui.home).get("enterpriseGateway")
                    if isinstance(gateway, dict) and gateway.get("jwt"):
                        tui.steps.append("signed in")
                        return dict(gateway)
                    raise LoginError(f"connected, but no enterpriseGateway credentials\n{tui.describe(screen)}")
        elif prompt is not None:
            if prompt == "" and once("prompt", screen):
                logins += 1
                if logins > attempts:
                    raise LoginError(f"/login typed {attempts} times without connecting\n{tui.describe(screen)}")
                tui.type("/login")
                time.sleep(0.3)
                tui.keys("Enter")
            elif prompt.startswith("/login") and once("/login typed", screen):
                tui.keys("Enter")
            elif prompt not in ("", "/login") and once("clear the prompt", screen):
                tui.keys("C-u")
        if prompt is None:
            idle_since = None
        time.sleep(0.25)


def _check_browser(tui: ClaudeTui, screen: str) -> None:
    """Fail early when the browser script already said it failed (its log's last line)."""
    log = tui.home / HARNESS_DIR / "browser.log"
    if not log.exists():
        return
    lines = log.read_text(errors="replace").splitlines()
    if lines and ("error:" in lines[-1] or lines[-1].rstrip().endswith("(failed)")):
        raise LoginError(f"the browser half failed: {lines[-1]}\n{tui.describe(screen)}", screen=screen)


def user_code(screen: str) -> str | None:
    """The ``Code:  XXXX-XXXX`` the sign-in screen shows, if any."""
    found = _CODE.search(screen)
    return found.group("code") if found else None


def claude_login(
    cli: Path,
    gateway_url: str,
    home: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    browser_action: str = "continue",
    approve_env: bool = True,
    timeout: float = 120.0,
    on_screen: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    """Sign the real CLI in to the gateway at ``gateway_url`` with ``/login``, in the fresh HOME ``home``:
    :func:`prepare_home` (``settings`` added to settings.json), :func:`write_browser_script` (``browser_action``:
    ``continue`` or ``deny``; its log at ``HOME/.login-harness/browser.log``), the TUI in a private tmux server
    (``env`` added to its environment), :func:`sign_in`, ``/exit``; the tmux server is killed whatever happens.
    Returns ``~/.claude/.credentials.json``'s ``enterpriseGateway``; raises :class:`LoginError` (the screen, the
    steps and the browser's log in its message) when the sign-in does not complete."""
    prepare_home(home, gateway_url, settings=settings)
    harness = home / HARNESS_DIR
    browser = write_browser_script(harness / "browser", log=harness / "browser.log", action=browser_action)
    tui = ClaudeTui(cli, home, env={"BROWSER": str(browser), **(env or {})})
    try:
        tui.start()
        gateway = sign_in(tui, approve_env=approve_env, timeout=timeout, on_screen=on_screen)
        if not tui.exited():
            tui.exit()
        return gateway
    finally:
        tui.close()
