"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``, pinned) for the end-to-end tests: where it is and
one way to run it, ``claude -p "<prompt>"`` in a fresh HOME with only the environment the test gives.

``.ci/run`` installs it with npm into a cache outside the checkout and exports ``MESSAGES_GATEWAY_CLAUDE_CLI``
(and ``MESSAGES_GATEWAY_REQUIRE_CLAUDE_CLI=1``); for a local run the same command does::

    DIR="${XDG_CACHE_HOME:-$HOME/.cache}/messages-gateway/claude-code-2.1.332"
    npm install --prefix "$DIR" --no-audit --no-fund @anthropic-ai/claude-code@2.1.332

The package declares Node 22 (npm warns EBADENGINE on Node 20) but ships a native binary: its postinstall links
the platform's ``claude`` over ``bin/claude.exe``, so Node's version does not matter to it once installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CLAUDE_CODE_VERSION",
    "ENV_CLI",
    "ENV_REQUIRE",
    "ClaudeRun",
    "cache_dir",
    "cli_version",
    "find_claude_cli",
    "run_claude",
]

CLAUDE_CODE_VERSION = "2.1.332"
ENV_CLI = "MESSAGES_GATEWAY_CLAUDE_CLI"  # the path of an installed `claude`
ENV_REQUIRE = "MESSAGES_GATEWAY_REQUIRE_CLAUDE_CLI"  # set: a missing CLI fails the tests instead of skipping them

# Always set for the CLI: no self-update, no telemetry, error reports, feedback surveys or start-up probes
# (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC implies the rest; they are spelled out so that none depends on it).
QUIET_ENV = {
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
# Inherited from the test's own environment (nothing else is: no ANTHROPIC_*, AWS_*, proxies or user config).
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")
# The fresh HOME's ~/.claude/settings.json: no attribution reminder, which the CLI otherwise puts before the
# prompt in the first user message (the mock provider echoes the start of that message).
DEFAULT_SETTINGS: dict[str, Any] = {"attribution": {"commit": "", "pr": ""}, "includeCoAuthoredBy": False}


def cache_dir(version: str = CLAUDE_CODE_VERSION) -> Path:
    """Where ``.ci/run`` installs the CLI: ``${XDG_CACHE_HOME:-$HOME/.cache}/messages-gateway/claude-code-V``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "messages-gateway" / f"claude-code-{version}"


def find_claude_cli() -> Path | None:
    """``$MESSAGES_GATEWAY_CLAUDE_CLI`` if set (None when that is not an executable file), else the cache's
    ``node_modules/.bin/claude``, else None."""
    given = os.environ.get(ENV_CLI)
    candidate = Path(given) if given else cache_dir() / "node_modules" / ".bin" / "claude"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    return None


def cli_version(cli: Path) -> str | None:
    """The version ``claude --version`` prints (``2.1.332``), or None when it does not run."""
    try:
        with tempfile.TemporaryDirectory(prefix="claude-home-") as home:
            out = subprocess.run(
                [str(cli), "--version"],
                capture_output=True,
                text=True,
                timeout=30,
                env={**_inherited(), **QUIET_ENV, "HOME": home},
                stdin=subprocess.DEVNULL,
            )
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()
    return words[0] if out.returncode == 0 and words else None


@dataclass
class ClaudeRun:
    """One finished ``claude -p`` run. ``returncode`` is None when it was killed at its timeout."""

    args: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines of ``--output-format stream-json`` (other lines skipped)."""
        out: list[dict[str, Any]] = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    out.append(value)
        return out

    def describe(self) -> str:
        """For assertion messages: how it ended, and what it printed."""
        ended = "timed out" if self.timed_out else f"exit {self.returncode}"
        return (
            f"claude {' '.join(self.args)!r}: {ended} after {self.elapsed:.1f} s\n"
            f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"
        )


def _inherited() -> dict[str, str]:
    return {k: os.environ[k] for k in _INHERITED if k in os.environ}


def run_claude(
    cli: Path,
    prompt: str,
    *,
    env: Mapping[str, str],
    args: Sequence[str] = (),
    timeout: float = 45.0,
    home: Path | None = None,
    settings: Mapping[str, Any] | None = DEFAULT_SETTINGS,
) -> ClaudeRun:
    """Run ``claude -p PROMPT *args`` and wait for it (killed, with its process group, after ``timeout`` s).

    It gets a fresh HOME (``home``, or a temporary directory removed afterwards) holding only
    ``~/.claude/settings.json`` from ``settings`` (None: no file), runs in an empty directory inside it, and sees
    only PATH and the locale from this process's environment, :data:`QUIET_ENV`, and ``env`` (base URLs, keys,
    the provider mode's variables) — so the developer's own login, config and ``ANTHROPIC_*`` never reach it.
    """
    owned = home is None
    root = Path(tempfile.mkdtemp(prefix="claude-home-")) if home is None else home
    try:
        root.mkdir(parents=True, exist_ok=True)
        if settings is not None:
            (root / ".claude").mkdir(exist_ok=True)
            (root / ".claude" / "settings.json").write_text(json.dumps(settings))
        work = root / "work"
        work.mkdir(exist_ok=True)
        full_env = {
            **_inherited(),
            "HOME": str(root),
            "USERPROFILE": str(root),
            "XDG_CONFIG_HOME": str(root / ".config"),
            "XDG_CACHE_HOME": str(root / ".cache"),
            "XDG_DATA_HOME": str(root / ".local" / "share"),
            "XDG_STATE_HOME": str(root / ".local" / "state"),
            "TMPDIR": str(root / "tmp"),
            **QUIET_ENV,
            **env,
        }
        (root / "tmp").mkdir(exist_ok=True)
        argv = ["-p", prompt, *args]
        start = time.monotonic()
        proc = subprocess.Popen(
            [str(cli), *argv],
            cwd=work,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, killed whole at the timeout
        )
        returncode: int | None
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            returncode = None
        return ClaudeRun(argv, returncode, stdout, stderr, time.monotonic() - start)
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
