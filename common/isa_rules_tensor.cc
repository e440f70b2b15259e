// The rules of the Tensor engine's instructions (matmul and the convolutions): docs/isa.md,
// "Instructions", "Tensor". isa_rules.cc dispatches here after the checks
// every instruction shares (operand structure, segments, extents).
#include <algorithm>
#include <cmath>

#include "common/isa_rules_internal.h"

namespace tern::isa::rules {
namespace {

struct ConvParams {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
};

// `forward`: conv2d, whose ints may end with an activation (floats: its
// parameters); the backward instructions take exactly 7 ints or none.
Status ConvInts(const Checker& c, ConvParams* p, bool forward) {
  const size_t count = c.ints().size();
  if (count != 0 && count != 7 && !(forward && count == 8)) {
    return c.Fail(
        "takes 7 ints (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups){} or "
        "none for the defaults, got {}",
        forward ? ", optionally followed by the activation," : "", count);
  }
  if (count == 8) {
    TERN_RETURN_IF_ERROR(CheckActivation(c, c.ints()[7], c.floats()));
  } else {
    TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  }
  if (count == 0) return OkStatus();
  static constexpr const char* kNames[] = {"stride_h",   "stride_w",   "pad_h", "pad_w",
                                           "dilation_h", "dilation_w", "groups"};
  constexpr int64_t kLimit = int64_t{1} << 31;
  for (size_t i = 0; i < 7; ++i) {
    int64_t v = c.ints()[i];
    int64_t min = (i == 2 || i == 3) ? 0 : 1;
    if (v < min || v > kLimit)
      return c.Fail("{} (ints[{}]) is {}; it must be in [{}, 2^31]", kNames[i], i, v, min);
  }
  *p = {c.ints()[0], c.ints()[1], c.ints()[2], c.ints()[3], c.ints()[4], c.ints()[5], c.ints()[6]};
  return OkStatus();
}

// Output size of one spatial dimension, or -1 if the kernel does not fit.
int64_t ConvOutSize(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  __int128 span = static_cast<__int128>(in) + 2 * static_cast<__int128>(pad);
  __int128 eff = static_cast<__int128>(dil) * (k - 1) + 1;
  if (k == 0 || span < eff) return -1;
  return static_cast<int64_t>((span - eff) / stride + 1);
}

// Checks the geometry of input [N,C,H,W], weight [O,C/g,KH,KW], out [N,O,OH,OW]
// given as slots of the instruction.
Status CheckConvGeometry(const Checker& c, const ConvParams& p, size_t input, size_t weight,
                         size_t out) {
  for (size_t slot : {input, weight, out}) TERN_RETURN_IF_ERROR(c.RankIs(slot, 4));
  for (size_t slot : {input, weight, out}) TERN_RETURN_IF_ERROR(c.FloatDtype(slot));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(weight, input));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(out, input));
  const auto& in = c.Op(input).shape;
  const auto& w = c.Op(weight).shape;
  const auto& o = c.Op(out).shape;
  if (in[1] % p.groups != 0) {
    return c.Fail("{} is {}: its {} channels are not divisible by groups = {}", c.Name(input),
                  c.Describe(input), in[1], p.groups);
  }
  if (w[0] % p.groups != 0) {
    return c.Fail("{} is {}: its {} output channels are not divisible by groups = {}",
                  c.Name(weight), c.Describe(weight), w[0], p.groups);
  }
  if (w[1] != in[1] / p.groups) {
    return c.Fail("{} is {} but {} is {}: weight must have C / groups = {} input channels",
                  c.Name(weight), c.Describe(weight), c.Name(input), c.Describe(input),
                  in[1] / p.groups);
  }
  if (o[0] != in[0]) {
    return c.Fail("{} is {} but {} is {}: batch sizes differ", c.Name(out), c.Describe(out),
                  c.Name(input), c.Describe(input));
  }
  if (o[1] != w[0]) {
    return c.Fail("{} is {} but {} is {}: {} must have {} channels (weight's O)", c.Name(out),
                  c.Describe(out), c.Name(weight), c.Describe(weight), c.Name(out), w[0]);
  }
  int64_t oh = ConvOutSize(in[2], w[2], p.stride_h, p.pad_h, p.dil_h);
  int64_t ow = ConvOutSize(in[3], w[3], p.stride_w, p.pad_w, p.dil_w);
  if (oh < 0 || ow < 0) {
    return c.Fail("{} is {} and {} is {}: the (dilated) kernel does not fit the padded input",
                  c.Name(weight), c.Describe(weight), c.Name(input), c.Describe(input));
  }
  if (o[2] != oh || o[3] != ow) {
    return c.Fail(
        "{} is {} but {} and {} with stride ({}, {}), padding ({}, {}), dilation ({}, {}) give "
        "spatial size [{}, {}]",
        c.Name(out), c.Describe(out), c.Name(input), c.Name(weight), p.stride_h, p.stride_w,
        p.pad_h, p.pad_w, p.dil_h, p.dil_w, oh, ow);
  }
  return OkStatus();
}

// The epilogue operand `residual` (slot 4) of matmul and conv2d: out's shape
// and dtype, a float dtype.
Status CheckResidual(const Checker& c) {
  if (!c.Has(4)) return OkStatus();
  TERN_RETURN_IF_ERROR(c.FloatDtype(0));
  return c.SameShapeAndDtypeAs(4, 0);
}

}  // namespace

Status CheckMatmul(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 3, "transpose_a, transpose_b, activation"));
  const int64_t activation = c.ints().size() > 2 ? c.ints()[2] : TERN_ACTIVATION_NONE;
  const size_t own_floats = std::min<size_t>(c.floats().size(), 2);
  if (activation == TERN_ACTIVATION_NONE || UnaryParameterCount(activation) == 0) {
    TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "alpha, beta"));
  } else if (c.floats().size() < 2) {
    return c.Fail(
        "takes floats [alpha, beta, activation parameters...] when the activation has "
        "parameters, got {} floats",
        c.floats().size());
  }
  for (size_t i = 0; i < own_floats; ++i) {
    if (!std::isfinite(c.floats()[i]))
      return c.Fail("floats[{}] ({}) is {}; it must be finite", i, i == 0 ? "alpha" : "beta",
                    c.floats()[i]);
  }
  TERN_RETURN_IF_ERROR(CheckActivation(c, activation, c.floats().subspan(own_floats)));
  if (activation != TERN_ACTIVATION_NONE) TERN_RETURN_IF_ERROR(c.FloatDtype(0));
  TERN_RETURN_IF_ERROR(CheckResidual(c));
  for (size_t i = 0; i < std::min<size_t>(c.ints().size(), 2); ++i) {
    if (c.ints()[i] != 0 && c.ints()[i] != 1) {
      return c.Fail("ints[{}] ({}) is {}; it must be 0 or 1", i,
                    i == 0 ? "transpose_a" : "transpose_b", c.ints()[i]);
    }
  }
  const bool ta = c.ints().size() > 0 && c.ints()[0];
  const bool tb = c.ints().size() > 1 && c.ints()[1];
  const OperandDesc& out = c.Op(0);
  const OperandDesc& a = c.Op(1);
  const OperandDesc& b = c.Op(2);
  // dtypes: a and b equal; out equal to them, or f32 when they are bf16/f16.
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 1));
  TERN_RETURN_IF_ERROR(c.NotBool(1));
  if (out.dtype != a.dtype && !(out.dtype == TERN_DTYPE_F32 && IsFloat(a.dtype))) {
    return c.Fail("out is {} but a is {}: out must have a's dtype (or f32 for bf16/f16 inputs)",
                  c.Describe(0), c.Describe(1));
  }
  if (IsInteger(a.dtype)) {
    for (size_t i = 0; i < c.floats().size(); ++i) {
      if (c.floats()[i] != std::trunc(c.floats()[i])) {
        return c.Fail("floats[{}] ({}) is {}; integer matmul takes integral alpha and beta", i,
                      i == 0 ? "alpha" : "beta", c.floats()[i]);
      }
    }
  }
  if (out.rank < 2)
    return c.Fail("out is {}; it must have rank 2 or more ([..., M, N])", c.Describe(0));
  for (size_t slot : {size_t{1}, size_t{2}}) {
    if (c.Op(slot).rank != out.rank) {
      return c.Fail(
          "{} is {} but out is {}: operands must have out's rank (batch dimensions broadcast with "
          "stride 0)",
          c.Name(slot), c.Describe(slot), c.Describe(0));
    }
  }
  const uint32_t r = out.rank;
  const int64_t m = out.shape[r - 2], n = out.shape[r - 1];
  const int64_t a_m = ta ? a.shape[r - 1] : a.shape[r - 2];
  const int64_t a_k = ta ? a.shape[r - 2] : a.shape[r - 1];
  const int64_t b_k = tb ? b.shape[r - 1] : b.shape[r - 2];
  const int64_t b_n = tb ? b.shape[r - 2] : b.shape[r - 1];
  if (a_k != b_k) {
    return c.Fail("a is {}{} but b is {}{}: inner dimensions {} and {} differ", c.Describe(1),
                  ta ? " (transposed)" : "", c.Describe(2), tb ? " (transposed)" : "", a_k, b_k);
  }
  if (a_m != m) {
    return c.Fail("a is {}{} but out is {}: a has {} rows, out has {}", c.Describe(1),
                  ta ? " (transposed)" : "", c.Describe(0), a_m, m);
  }
  if (b_n != n) {
    return c.Fail("b is {}{} but out is {}: b has {} columns, out has {}", c.Describe(2),
                  tb ? " (transposed)" : "", c.Describe(0), b_n, n);
  }
  for (uint32_t i = 0; i + 2 < r; ++i) {
    for (size_t slot : {size_t{1}, size_t{2}}) {
      if (c.Op(slot).shape[i] != out.shape[i]) {
        return c.Fail(
            "{} is {} but out is {}: batch dimension {} is {} in {} and {} in out (broadcast with "
            "stride 0)",
            c.Name(slot), c.Describe(slot), c.Describe(0), i, c.Op(slot).shape[i], c.Name(slot),
            out.shape[i]);
      }
    }
  }
  if (c.Has(3)) {
    const OperandDesc& bias = c.Op(3);
    TERN_RETURN_IF_ERROR(c.SameDtypeAs(3, 0));
    if (bias.rank == 1) {
      if (bias.shape[0] != n) {
        return c.Fail("bias is {} but out is {}: a rank-1 bias has N = {} elements", c.Describe(3),
                      c.Describe(0), n);
      }
    } else if (!SameShape(bias, out)) {
      return c.Fail(
          "bias is {} but out is {}: bias must be [N] or have out's shape (broadcast with stride "
          "0)",
          c.Describe(3), c.Describe(0));
    }
  }
  return OkStatus();
}

Status CheckConv2d(Checker& c) {
  ConvParams p;
  TERN_RETURN_IF_ERROR(ConvInts(c, &p, true));
  TERN_RETURN_IF_ERROR(CheckResidual(c));
  TERN_RETURN_IF_ERROR(CheckConvGeometry(c, p, 1, 2, 0));
  if (c.Has(3)) {
    TERN_RETURN_IF_ERROR(c.RankIs(3, 1));
    if (c.Op(3).shape[0] != c.Op(0).shape[1]) {
      return c.Fail("bias is {} but out is {}: bias must have one element per output channel",
                    c.Describe(3), c.Describe(0));
    }
    TERN_RETURN_IF_ERROR(c.SameDtypeAs(3, 0));
  }
  return OkStatus();
}

Status CheckConv2dBackwardInput(Checker& c) {
  ConvParams p;
  TERN_RETURN_IF_ERROR(ConvInts(c, &p, false));
  // grad_input plays the input, grad_out the output.
  return CheckConvGeometry(c, p, 0, 2, 1);
}

Status CheckConv2dBackwardWeight(Checker& c) {
  ConvParams p;
  TERN_RETURN_IF_ERROR(ConvInts(c, &p, false));
  return CheckConvGeometry(c, p, 2, 0, 1);
}

}  // namespace tern::isa::rules
