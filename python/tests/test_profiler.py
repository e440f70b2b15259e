"""torch.tern.profiler: a trace capture from Python, and tern's log messages
routed into Python's logging."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tern  # noqa: F401


def _span_names(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e["name"] for e in events if e.get("ph") == "X"]


def test_profile_records_the_commands_of_a_block(tmp_path):
    path = tmp_path / "trace.json"
    a = torch.arange(64, dtype=torch.float32)
    with torch.tern.profiler.profile(path):
        x = a.to("tern")
        y = (x + x).cpu()
        torch.tern.synchronize()
    torch.testing.assert_close(y, a + a)
    names = _span_names(path)
    text = "; ".join(names)
    assert any("copy H2D" in n for n in names), text
    assert any("copy D2H" in n for n in names), text
    assert any(n.startswith("execute") for n in names), text


def test_work_outside_the_capture_is_not_recorded(tmp_path):
    path = tmp_path / "trace.json"
    x = torch.ones(16, device="tern")
    torch.tern.synchronize()
    torch.tern.profiler.start(path)
    torch.tern.profiler.stop()
    (x * 2).cpu()
    assert not any("copy D2H" in n for n in _span_names(path))


def test_one_capture_at_a_time(tmp_path):
    torch.tern.profiler.start(tmp_path / "a.json")
    try:
        with pytest.raises(RuntimeError, match="capture"):
            torch.tern.profiler.start(tmp_path / "b.json")
    finally:
        torch.tern.profiler.stop()
    with pytest.raises(RuntimeError, match="TERN_ERROR_FAILED_PRECONDITION"):
        torch.tern.profiler.stop()
    assert (tmp_path / "a.json").exists()
    assert not (tmp_path / "b.json").exists()


def test_profile_writes_the_file_when_the_block_raises(tmp_path):
    path = tmp_path / "trace.json"
    with pytest.raises(ValueError):
        with torch.tern.profiler.profile(path):
            torch.ones(4, device="tern").cpu()
            raise ValueError("inside the block")
    assert path.exists()
    # and the next capture may start
    with torch.tern.profiler.profile(tmp_path / "next.json"):
        pass


# tern logs "initialized: driver ..." at info level from tern_init, which runs
# once per process: each case runs in a fresh interpreter.
_LOGGING_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    import torch, torch_tern
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.levelno, record.getMessage()))
    logging.getLogger("torch_tern").addHandler(Keep())
    logging.getLogger("torch_tern").setLevel(logging.DEBUG)
    mode = sys.argv[1]
    if mode in ("logger", "stopped"):
        torch.tern.profiler.forward_logs()
    elif mode == "callable":
        torch.tern.profiler.forward_logs(lambda level, msg: records.append(("callable", level, msg)))
    if mode == "stopped":
        torch.tern.profiler.stop_forwarding_logs()
    assert torch.tern.profiler.forwarding_logs() == (mode in ("logger", "callable"))
    torch.tern.init()
    torch.tern.profiler.stop_forwarding_logs()  # delivers what was received
    for r in records:
        print("RECORD", *r, sep="|")
    """
)


def _run_logging_case(mode):
    env = dict(os.environ, TERN_LOG_LEVEL="info")
    return subprocess.run([sys.executable, "-c", _LOGGING_SCRIPT, mode], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", ["logger", "callable"])
def test_forward_logs_routes_tern_messages_to_python(mode):
    done = _run_logging_case(mode)
    assert done.returncode == 0, done.stderr
    records = [line.split("|")[1:] for line in done.stdout.splitlines()
               if line.startswith("RECORD|")]
    init = [r for r in records if "initialized: driver" in r[2]]
    assert len(init) == 1, done.stdout
    name, level, _ = init[0]
    assert name == ("torch_tern.runtime" if mode == "logger" else "callable")
    assert int(level) == 20  # logging.INFO
    assert "initialized: driver" not in done.stderr, "forwarded, not also printed"


def test_stop_forwarding_logs_restores_stderr():
    done = _run_logging_case("stopped")
    assert done.returncode == 0, done.stderr
    assert "RECORD" not in done.stdout
    assert "[tern] [info] initialized: driver" in done.stderr
