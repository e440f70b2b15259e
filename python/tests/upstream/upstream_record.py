"""pytest plugin of run_upstream.py: one JSON line per test, written as it ends.

Loaded with ``-p upstream_record`` (the runner puts this folder on PYTHONPATH)
and told where to write by UPSTREAM_RECORD_PATH. Each line is
``{"id", "outcome", "when", "cause", "seconds"}`` with outcome one of passed,
failed (the test body failed), errored (setup or teardown failed, or the file
did not import), skipped, xfailed, xpassed; ``cause`` is the exception type
and the first line of its message. Lines are flushed one by one, so a file
that runs past its time limit still leaves what it finished. At the end, one
line with outcome ``fallback`` gives the operators that took the CPU
fallback in the whole file (``torch_tern.get_fallback_ops()``).
"""

from __future__ import annotations

import json
import os

_PATH = os.environ.get("UPSTREAM_RECORD_PATH")
_out = open(_PATH, "a", buffering=1) if _PATH else None  # noqa: SIM115  (line-buffered, kept open)


def _cause(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0][:300]
    text = str(report.longrepr or "").strip().splitlines()
    # Collection errors and the like: the last line names the exception.
    for line in reversed(text):
        if line.startswith("E "):
            return line[1:].strip()[:300]
    return (text[-1] if text else "unknown")[:300]


def _write(record: dict) -> None:
    if _out is not None:
        _out.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report):
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if xfail:
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome  # passed, failed, skipped
    elif report.failed:
        outcome = "errored"  # setup or teardown
    elif report.skipped and report.when == "setup":
        outcome = "xfailed" if xfail else "skipped"
    else:
        return
    cause = ""
    if outcome in ("failed", "errored"):
        cause = _cause(report)
    elif outcome == "skipped" and isinstance(report.longrepr, tuple):
        cause = str(report.longrepr[2])[:300]
    _write({"id": report.nodeid, "outcome": outcome, "when": report.when,
            "cause": cause, "seconds": round(report.duration, 3)})


def pytest_collectreport(report):
    if report.failed:
        _write({"id": report.nodeid, "outcome": "errored", "when": "collect",
                "cause": _cause(report), "seconds": 0.0})


def pytest_sessionfinish(session, exitstatus):
    # The operators that went through the CPU fallback in the whole file.
    try:
        import torch_tern

        ops = torch_tern.get_fallback_ops()
    except Exception:  # noqa: BLE001  (torch_tern failed to load: nothing to add)
        return
    _write({"id": "<fallback>", "outcome": "fallback", "when": "session",
            "cause": "", "seconds": 0.0, "ops": ops})
