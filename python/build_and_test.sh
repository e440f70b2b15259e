#!/usr/bin/env bash
# Builds the torch_tern plugin into the repository's virtual environment and
# runs its tests. Works from a clean clone on a Debian machine that has the
# repository's packages (scripts/install-deps.sh); the virtual environment and
# its packages come from scripts/setup-venv.sh.
#
#   python/build_and_test.sh                 # build + all tests
#   python/build_and_test.sh -k memory       # extra arguments go to pytest
#   TORCH_TERN_SKIP_BUILD=1 python/build_and_test.sh   # tests only
#   TORCH_TERN_TERN_BUILD_DIR=$PWD/build python/build_and_test.sh
#       # link that (built, unsanitized) tree's libtern and compiler instead
#       # of compiling them again (scripts/test.sh does)
#
# Environment: TORCH_TERN_VENV (default <repo>/.venv), CMAKE_BUILD_PARALLEL_LEVEL
# (default 2: the project's machines have two cores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="$("$root/scripts/setup-venv.sh")"

if [[ "${TORCH_TERN_SKIP_BUILD:-0}" != 1 ]]; then
  tern_build_dir="${TORCH_TERN_TERN_BUILD_DIR:-}"
  if [[ -n "$tern_build_dir" ]]; then
    echo "== building and installing torch_tern (libtern and the compiler from $tern_build_dir)"
  else
    echo "== building and installing torch_tern (libtern is built from $root)"
  fi
  # --no-build-isolation: compile against the torch in this environment;
  # --no-deps: never let pip resolve torch again. The build-tree option is
  # always passed, empty or not: the plugin's build folder persists.
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$py" -m pip install --quiet --no-build-isolation --no-deps \
    --config-settings=cmake.define.TORCH_TERN_TERN_BUILD_DIR="$tern_build_dir" "$here"
fi

echo "== pytest $here/tests"
# -P and the repository root as working directory: the source folder
# python/torch_tern (no compiled _C) must never shadow the installed package.
cd "$root"
exec "$py" -P -m pytest "$here/tests" -q -p no:cacheprovider "$@"
