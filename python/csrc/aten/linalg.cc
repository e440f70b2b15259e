// linalg_solve_triangular on tern, for float32 systems of up to
// kMaxOrder unknowns (the chunked gated-delta-rule layers of Qwen3-Next,
// Qwen3.5 and OLMo-hybrid solve 64 x 64 unit lower-triangular systems in the
// forward and, through autograd, upper ones in the backward). No engine has a
// substitution instruction, so the inverse of the triangle is formed from
// native matrix products: with A = D (I + N), D its diagonal (I when
// unitriangular) and N = D^-1 times A's strict triangle (nilpotent: N^n = 0),
//
//   (I + N)^-1 = (I - N)(I + N^2)(I + N^4) ... (I + N^(2^(m-1))),  2^m >= n,
//
// that is 2 log2(n) batched matmuls, then A^-1 = (I + N)^-1 D^-1 and X =
// A^-1 B (left) or B A^-1. Exact in exact arithmetic; the rounding differs
// from LAPACK's substitution (the CPU's), within float32's for the
// well-conditioned systems models build (the tests compare against the CPU
// and float64). Only the triangle named by `upper` is read, as on the CPU.
// Other dtypes, larger systems and anything unusual take the CPU fallback.
#include <ATen/ATen.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

constexpr int64_t kMaxOrder = 256;

// A^-1 of the triangle of `a` ([..., n, n] float32 on tern), built from
// native operators.
at::Tensor TriangularInverse(const at::Tensor& a, bool upper, bool unitriangular) {
  const int64_t n = a.size(-1);
  at::Tensor strict = upper ? a.triu(1) : a.tril(-1);
  at::Tensor diagonal;
  if (!unitriangular) {
    diagonal = a.diagonal(0, -2, -1);
    strict = strict / diagonal.unsqueeze(-1);  // D^-1 N: row i divided by d_i
  }
  const at::Tensor eye = at::eye(n, a.options());
  at::Tensor power = -strict;        // M = -N; power = M^(2^j)
  at::Tensor inverse = eye + power;  // sum of M^k for k < 2^j
  for (int64_t covered = 2; covered < n; covered *= 2) {
    power = at::matmul(power, power);
    inverse = inverse + at::matmul(inverse, power);
  }
  if (!unitriangular) inverse = inverse / diagonal.unsqueeze(-2);  // column j by d_j
  return inverse;
}

// Whether the native path takes these operands (else the CPU fallback, with
// its results and errors).
bool Native(const at::Tensor& a, const at::Tensor& b, bool left) {
  return IsTern(a) && IsTern(b) && a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
         a.dim() >= 2 && b.dim() >= 2 && a.size(-1) == a.size(-2) && a.size(-1) <= kMaxOrder &&
         b.size(left ? -2 : -1) == a.size(-1) && a.numel() > 0 && b.numel() > 0 && !a.is_conj() &&
         !b.is_conj() && !a.is_neg() && !b.is_neg();
}

at::Tensor Solve(const at::Tensor& a, const at::Tensor& b, bool upper, bool left,
                 bool unitriangular) {
  const at::Tensor inverse = TriangularInverse(a, upper, unitriangular);
  return left ? at::matmul(inverse, b) : at::matmul(b, inverse);
}

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& SolveTriangularOut(const at::Tensor& a, const at::Tensor& b, bool upper, bool left,
                               bool unitriangular, at::Tensor& out) {
  if (Native(a, b, left) && IsTern(out) && out.scalar_type() == at::kFloat) {
    const at::Tensor x = Solve(a, b, upper, left, unitriangular);
    ResizeOut(out, x.sizes());
    out.copy_(x);
    return out;
  }
  return TERN_FALLBACK(linalg_solve_triangular_out, a, b, upper, left, unitriangular, out);
}
TERN_ATEN_IMPL("linalg_solve_triangular.out", SolveTriangularOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor SolveTriangular(const at::Tensor& a, const at::Tensor& b, bool upper, bool left,
                           bool unitriangular) {
  if (Native(a, b, left)) return Solve(a, b, upper, left, unitriangular);
  return TERN_FALLBACK(linalg_solve_triangular, a, b, upper, left, unitriangular);
}
TERN_ATEN_IMPL("linalg_solve_triangular", SolveTriangular);

}  // namespace
}  // namespace torch_tern::native
