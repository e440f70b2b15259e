"""``python -m torch_tern.collect_env``: what a bug report about torch_tern needs.

Prints the versions (Python, torch, torch_tern, libtern and the driver
backend), every tern device with its cores and HBM, and whether the device is
usable from torch: "yes", or "no" with the reason.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def cpu_model() -> str:
    """The host CPU's model name (what benchmarks print beside their figures)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _usable(torch, torch_tern) -> tuple[bool, str]:
    """Round-trips a tensor through device 0 with the plugin's native copies."""
    try:
        torch_tern.device_module.init()
        if torch.tern.device_count() == 0:
            return False, "tern initialized but reports no devices"
        host = torch.arange(16, dtype=torch.float32)
        dev = host.to("tern")
        dev.fill_(3.0)
        back = dev.cpu()
        if not bool((back == 3.0).all()):
            return False, "a fill/copy round trip through tern:0 returned wrong values"
        return True, ""
    except Exception as err:  # report, never crash: this is a diagnostic
        return False, f"{type(err).__name__}: {err}"


def collect() -> list[str]:
    lines = [f"Python: {sys.version.split()[0]} ({platform.platform()})",
             f"CPU: {cpu_model()}, {os.cpu_count()} CPUs"]
    try:
        import torch
    except Exception as err:
        return lines + [f"torch: not importable ({err})", "tern usable from torch: no (torch missing)"]
    lines.append(f"torch: {torch.__version__}")
    try:
        import torch_tern
        from torch_tern import _C
    except Exception as err:
        return lines + [f"torch_tern: not importable ({err})",
                        f"tern usable from torch: no (torch_tern does not import: {err})"]
    lines.append(f"torch_tern: {torch_tern.__version__} ({os.path.dirname(torch_tern.__file__)})")
    version = _C._tern_version()
    lines.append(f"libtern: {version['major']}.{version['minor']}.{version['patch']} "
                 f"(built against headers {version['headers']}; {version['build']})")
    for var in ("TERN_DRIVER", "TERN_VISIBLE_CORES", "TERN_SIM_TOPOLOGY", "TERN_SIM_NODE",
                "TORCH_TERN_FALLBACK", "TORCH_TERN_CORE", "TORCH_TERN_KERNELS"):
        if os.environ.get(var):
            lines.append(f"  {var}={os.environ[var]}")
    count = _C._device_count()
    if count == 0:
        reason = _C._init_error() or "no tern device is visible"
        lines.append("driver backend: unknown")
        lines.append("devices: 0")
        lines.append(f"tern usable from torch: no ({reason})")
        return lines
    lines.append(f"driver backend: {_C._driver_name()}")
    lines.append(f"devices: {count}")
    for index in range(count):
        info = _C._device_info(index)
        mem = _C._tern_memory_info(index)
        lines.append(
            f"  tern:{index}: {info['name']} (driver {info['driver']}, physical {info['physical_index']}), "
            f"cores {info['core_count']}/{info['physical_core_count']}, "
            f"HBM {_fmt_bytes(info['memory_bytes'])} ({_fmt_bytes(mem['free_bytes'])} free node-wide), "
            f"NUMA {info['numa_node']}"
        )
    cache = _C._kernel_cache_info()
    lines.append(f"native executables: {'available' if cache['executables_available'] else 'not available'}")
    ok, reason = _usable(torch, torch_tern)
    lines.append("tern usable from torch: yes" if ok else f"tern usable from torch: no ({reason})")
    return lines


def main() -> int:
    for line in collect():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
