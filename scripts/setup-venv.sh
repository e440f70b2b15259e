#!/usr/bin/env bash
# Creates the repository's Python virtual environment (default <repo>/.venv,
# or TORCH_TERN_VENV) and installs what the plugin, its tests and the
# benchmark scripts need, with torch pinned to 2.13.0 (the CPU build this
# project's machines install): pip never replaces it with another version,
# also when another package (transformers) asks for torch. Safe to run again:
# it only calls pip when something is missing. Prints the venv's python.
# Usage: scripts/setup-venv.sh   (then: "$(scripts/setup-venv.sh)" -m ...)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TORCH_TERN_VENV:-$root/.venv}"
py="$venv/bin/python"

if [[ ! -x "$py" ]]; then
  echo "== creating $venv" >&2
  if ! python3 -m venv "$venv" >&2; then
    echo "error: 'python3 -m venv' failed: this Python has no venv module." >&2
    echo "  On Debian's own python3: apt-get install python3-venv python3-dev, then run again." >&2
    exit 1
  fi
fi

# What is missing? (Autoloading off: an old, broken plugin must not stop the check.)
missing="$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$py" - <<'PY'
import importlib.metadata as md
want = {"torch": "2.13.0", "numpy": None, "pytest": None, "expecttest": None,
        "scikit-build-core": None, "transformers": None, "pyyaml": None}
out = []
for name, version in want.items():
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is None or (version and have.split("+")[0] != version):
        out.append(f"{name}=={version}" if version else name)
print(" ".join(out))
PY
)"
if [[ -n "$missing" ]]; then
  echo "== installing into $venv: $missing" >&2
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  echo "torch==2.13.0" > "$constraints"
  # shellcheck disable=SC2086  # $missing is a list of requirement strings
  "$py" -m pip install --quiet -c "$constraints" $missing >&2
  torch_version="$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$py" -c 'import torch; print(torch.__version__)')"
  if [[ "${torch_version%%+*}" != 2.13.0 ]]; then
    echo "error: torch is $torch_version after installing packages, expected 2.13.0" >&2
    exit 1
  fi
fi
echo "$py"
