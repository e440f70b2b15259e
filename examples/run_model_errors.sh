#!/bin/sh
# Feeds run_model broken inputs and checks that each is refused with the
# right exit status and a message that says what is wrong.
#   run_model_errors.sh RUN_MODEL MLP_GEN DIR
# DIR holds mlp.tern, x.npy and y_expected.npy as example.mlp_gen writes
# them (x is f32 [8, 32], y is f32 [8, 5]).
set -u
run_model=$1
mlp_gen=$2
dir=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/tern-run-model-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failures=0

# expect STATUS PATTERN ARGS...: runs run_model ARGS, wants exit status
# STATUS and PATTERN (a grep -E expression) in what it printed to stderr.
expect() {
  want_status=$1
  pattern=$2
  shift 2
  "$run_model" "$@" --no-output >"$work/stdout" 2>"$work/stderr"
  status=$?
  if [ "$status" -ne "$want_status" ] || ! grep -Eq "$pattern" "$work/stderr"; then
    echo "FAILED: run_model $*"
    echo "  wanted exit status $want_status and stderr matching: $pattern"
    echo "  got exit status $status and stderr:"
    sed 's/^/    /' "$work/stderr"
    failures=$((failures + 1))
  else
    echo "ok: exit $status: $(head -n 1 "$work/stderr")"
  fi
}

# with_header FILE SED_EXPRESSION OUT: copies a .npy file, editing only its
# text header (format 1.0: 10 bytes, then the header length at bytes 8-9).
with_header() {
  length=$(od -An -tu2 -j8 -N2 "$1" | tr -d ' ')
  total=$((10 + length))
  head -c "$total" "$1" | sed "$2" >"$3"
  tail -c "+$((total + 1))" "$1" >>"$3"
}

model=$dir/mlp.tern
x=$dir/x.npy
y=$dir/y_expected.npy

# The good case, as a baseline for the ones below.
if ! "$run_model" "$model" "$x" --expect "$y" --no-output >"$work/stdout" 2>&1; then
  echo "FAILED: the unmodified files do not pass:"
  cat "$work/stdout"
  exit 1
fi

# Not a .npy file at all.
echo "just text" >"$work/text.npy"
expect 3 "not a \.npy file" "$model" "$work/text.npy"
# Missing.
expect 3 "cannot open it" "$model" "$work/missing.npy"
# Cut short: the data ends early.
size=$(wc -c <"$x")
head -c "$((size - 100))" "$x" >"$work/truncated.npy"
expect 3 "truncated" "$model" "$work/truncated.npy"
# Cut inside the header.
head -c 40 "$x" >"$work/short_header.npy"
expect 3 "truncated inside its" "$model" "$work/short_header.npy"
# A byte too many.
cp "$x" "$work/long.npy"
printf 'z' >>"$work/long.npy"
expect 3 "extra bytes" "$model" "$work/long.npy"
# The right size, the wrong dtype (int32 has 4 bytes too).
with_header "$x" "s/<f4/<i4/" "$work/int32.npy"
expect 3 "holds i32 data, but input 0 'x' of function 'mlp' is f32 \[8, 32\]" \
  "$model" "$work/int32.npy"
# A dtype tern does not run.
with_header "$x" "s/<f4/<u4/" "$work/uint32.npy"
expect 3 "dtype '<u4' is not one tern runs" "$model" "$work/uint32.npy"
# Big-endian and Fortran order.
with_header "$x" "s/<f4/>f4/" "$work/big.npy"
expect 3 "big-endian" "$model" "$work/big.npy"
with_header "$x" "s/False/True /" "$work/fortran.npy"
expect 3 "Fortran" "$model" "$work/fortran.npy"
# The same bytes, another shape.
with_header "$x" "s/(8, 32)/(32, 8)/" "$work/transposed.npy"
expect 3 "has shape \(32, 8\), but input 0 'x' of function 'mlp' is f32 \[8, 32\]" \
  "$model" "$work/transposed.npy"
# A header that is not a dict.
with_header "$x" "s/{/[/" "$work/list.npy"
expect 3 "not a Python dict" "$model" "$work/list.npy"
# Names and counts.
expect 3 "no input named 'z'" "$model" "z=$x"
expect 3 "given twice" "$model" "x=$x" "x=$x"
expect 3 "1 input\\(s\\), all given already" "$model" "$x" "x=$x"
expect 3 "no file for input 0 'x'" "$model"
expect 3 "unknown option '--bogus'" "$model" "$x" --bogus 1
# A reference the output does not match: the same model with another seed.
"$mlp_gen" --seed 4 --batch 8 --in 32 --hidden 64 --out 5 \
  "$work/other.tern" "$work/other_x.npy" "$work/other_y.npy" >/dev/null || exit 1
expect 2 "output 'y' differs from .*other_y.npy in [0-9]+ of 40 elements" \
  "$model" "$x" --expect "$work/other_y.npy"
# A reference of the wrong shape.
expect 3 "reference .*x.npy has shape \(8, 32\), but output 'y' is f32 \[8, 5\]" \
  "$model" "$x" --expect "$x"
# Not an executable.
expect 1 "EXECUTABLE_INVALID" "$x" "$x"

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all cases refused as expected"
