"""pytest plugin of run_distributed_suite.py: one JSON line per test, as it ends.

Loaded with ``-p suite_record`` (the runner puts this folder on PYTHONPATH),
told where to write by SUITE_RECORD_PATH. Each line is ``{"id", "outcome",
"cause", "detail", "seconds"}``; outcome is passed, failed, errored (setup or
teardown), or skipped. A failed test of the multi-process harness reports
"Process <r> exited with error code 10 and exception: <traceback>"; ``cause``
is the last exception line of the first rank's traceback (what the rank
raised), ``detail`` the end of the report. For a skipped test, ``cause`` is
the reason.
"""

from __future__ import annotations

import json
import os
import re

_PATH = os.environ.get("SUITE_RECORD_PATH")
_out = open(_PATH, "a", buffering=1) if _PATH else None  # noqa: SIM115  (line-buffered, kept open)

# "SomeError: message" or "module.SomeError: message" at the start of a line.
_EXC = re.compile(r"^(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)\b.*)$")


def cause_of(text: str) -> str:
    """The exception a rank raised, from a failure report's text."""
    blocks = re.split(r"Process \d+ exited with error code \d+ and exception:", text)
    # The harness's own RuntimeError comes first; the ranks' tracebacks follow.
    for block in (blocks[1:] or blocks):
        found = ""
        for line in block.splitlines():
            if line.startswith("To execute this test") or line.startswith("Traceback"):
                if found:
                    break
                continue
            m = _EXC.match(line.strip())
            if m:
                found = m.group(1)
        if found:
            return found[:400]
    for line in reversed(text.strip().splitlines()):
        m = _EXC.match(line.strip())
        if m:
            return m.group(1)[:400]
    lines = text.strip().splitlines()
    return (lines[-1] if lines else "unknown")[:400]


def _write(record: dict) -> None:
    if _out is not None:
        _out.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report):
    if report.when == "call":
        outcome = report.outcome
    elif report.failed:
        outcome = "errored"
    elif report.skipped and report.when == "setup":
        outcome = "skipped"
    else:
        return
    cause, detail = "", ""
    if outcome in ("failed", "errored"):
        text = report.longreprtext or ""
        cause, detail = cause_of(text), text[-4000:]
    elif outcome == "skipped" and isinstance(report.longrepr, tuple):
        cause = str(report.longrepr[2]).removeprefix("Skipped: ")[:300]
    _write({"id": report.nodeid.split("::")[-1], "outcome": outcome, "cause": cause,
            "detail": detail, "seconds": round(report.duration, 2)})
