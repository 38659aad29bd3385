"""The CLI's serving notes, and the multiprocess metrics directory it makes for several workers."""

from __future__ import annotations

from typing import Any

from gateway.cli import main, serving_warnings


def test_several_workers_need_no_warning_any_more() -> None:
    """Their /metrics is exact (multiprocess mode, tests/e2e/test_lifecycle.py)."""
    assert serving_warnings(1, decoder="c", views=True) == []
    assert serving_warnings(4, decoder="c", views=True) == []


def test_several_workers_get_a_multiprocess_directory(monkeypatch: Any) -> None:
    import os

    from gateway.cli import multiprocess_metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # recorded, so the test leaves the variable as it found it
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    multiprocess_metrics(1)()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    cleanup = multiprocess_metrics(2)
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    assert os.path.isdir(directory)
    cleanup()
    assert not os.path.exists(directory) and "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/operator/chose")
    multiprocess_metrics(4)()  # the operator's directory is theirs
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == "/operator/chose"


def test_a_missing_compiled_decoder_is_announced() -> None:
    (note,) = serving_warnings(1, decoder="python", views=True)
    assert "_eventstream_c was not built" in note
    (note,) = serving_warnings(1, decoder="c", views=False)
    assert "_views_c was not built" in note


def test_check_config(tmp_path: object, capsys: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "g.yaml"
    path.write_text("auth: {open: true}\nproviders: {m: {kind: mock}}\nmodels: {a: {targets: [{provider: m}]}}\n")
    assert main(["check-config", str(path)]) == 0
    path.write_text("providers: {m: {kind: mock, nope: 1}}\n")
    assert main(["check-config", str(path)]) == 2


def test_logging_is_told_not_to_collect_what_the_format_does_not_show() -> None:
    import subprocess
    import sys

    code = (
        "import logging; from gateway.cli import configure_logging, LOG_FORMAT; configure_logging(); "
        "logging.getLogger('gateway.access').info('%s', 'x'); "
        "print(logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing); "
        "assert not any(f in LOG_FORMAT for f in ('lineno', 'funcName', 'pathname', 'thread', 'process'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["None", "False", "False", "False"]
    assert done.stderr.rstrip().endswith("INFO gateway.access: x")


def test_access_lines_written_directly_read_as_loggings_own() -> None:
    """``serve``'s logging writes access lines straight to its handler's stream: the same line as through
    ``logging`` (format, local time, milliseconds), and through ``logging`` again once anything else listens."""
    import re
    import subprocess
    import sys

    code = (
        "import logging, io; from gateway.cli import configure_logging; configure_logging(); "
        "from gateway.observability import recording; "
        "assert recording._direct is not None and recording._direct.usable(); "
        "recording.emit_access_line('{\"a\":1}'); "
        "logging.getLogger('gateway.access').info('%s', '{\"a\":1}'); "
        "seen = io.StringIO(); extra = logging.StreamHandler(seen); "
        "logging.getLogger('gateway.access').addHandler(extra); "
        "assert not recording._direct.usable(); "
        "recording.emit_access_line('{\"b\":2}'); "
        "assert seen.getvalue() == '{\"b\":2}\\n', seen.getvalue()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    assert re.fullmatch(stamp + r' INFO gateway\.access: \{"a":1\}', lines[0]), lines
    assert re.fullmatch(stamp + r' INFO gateway\.access: \{"a":1\}', lines[1]), lines
    assert lines[0][:16] == lines[1][:16]  # the same local time, to the minute
    assert re.fullmatch(stamp + r' INFO gateway\.access: \{"b":2\}', lines[2]), lines


def test_access_lines_go_through_logging_for_a_set_up_that_is_not_serves() -> None:
    import io
    import logging

    from gateway.observability import recording

    stream = io.StringIO()
    custom = logging.StreamHandler(stream)
    custom.setFormatter(logging.Formatter("%(name)s %(message)s"))
    recording.write_access_lines_to(custom)  # another format: never written directly
    assert recording._direct is None
    plain = logging.StreamHandler(stream)
    plain.setFormatter(logging.Formatter(recording.ACCESS_LINE_FORMAT))
    recording.write_access_lines_to(plain)
    try:
        assert recording._direct is not None
        assert not recording._direct.usable()  # not the root logger's handler here (pytest's are)
    finally:
        recording.write_access_lines_to(None)
    assert recording._direct is None


def test_a_missing_otlp_encoder_is_said() -> None:
    (note,) = serving_warnings(1, decoder="c", views=True, otlp="python")
    assert "_otlp_c was not built" in note
