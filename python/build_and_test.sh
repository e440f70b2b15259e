#!/usr/bin/env bash
# Builds the torch_tern plugin into the repository's virtual environment and
# runs its tests. Works from a clean clone on a Debian machine that has the
# repository's packages (scripts/install-deps.sh).
#
#   python/build_and_test.sh                 # build + all tests
#   python/build_and_test.sh -k memory       # extra arguments go to pytest
#   TORCH_TERN_SKIP_BUILD=1 python/build_and_test.sh   # tests only
#
# Environment: TORCH_TERN_VENV (default <repo>/.venv), CMAKE_BUILD_PARALLEL_LEVEL
# (default 2: the project's machines have two cores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${TORCH_TERN_VENV:-$root/.venv}"
py="$venv/bin/python"

if [[ ! -x "$py" ]]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi

# What is missing? (Autoloading off: an old, broken plugin must not stop the check.)
missing="$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$py" - <<'PY'
import importlib.metadata as md
want = {"torch": "2.13.0", "numpy": None, "pytest": None, "expecttest": None,
        "scikit-build-core": None, "transformers": None}
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
  echo "== installing into $venv: $missing"
  # torch is pinned, also as a constraint for everything else (transformers
  # and its dependencies): pip never replaces it with another version.
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  echo "torch==2.13.0" > "$constraints"
  "$py" -m pip install --quiet -c "$constraints" $missing
  torch_version="$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$py" -c 'import torch; print(torch.__version__)')"
  if [[ "${torch_version%%+*}" != 2.13.0 ]]; then
    echo "error: torch is $torch_version after installing packages, expected 2.13.0" >&2
    exit 1
  fi
fi

if [[ "${TORCH_TERN_SKIP_BUILD:-0}" != 1 ]]; then
  echo "== building and installing torch_tern (libtern is built from $root)"
  # --no-build-isolation: compile against the torch in this environment;
  # --no-deps: never let pip resolve torch again.
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$py" -m pip install --quiet --no-build-isolation --no-deps "$here"
fi

echo "== pytest $here/tests"
# -P and the repository root as working directory: the source folder
# python/torch_tern (no compiled _C) must never shadow the installed package.
cd "$root"
exec "$py" -P -m pytest "$here/tests" -q -p no:cacheprovider "$@"
