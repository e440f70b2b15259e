// Dimensions of tensor shapes in the compiler's graphs: a constant, or an
// affine function a*s + b of one symbolic size s (a sequence length, a batch)
// whose range [min, max] the graph declares. Exported PyTorch programs with
// dynamic shapes name their sizes s0, s1, ... and derive others from them
// (s0 * 12 after a reshape, s0 + 1 after a concatenation): one symbol with an
// integer factor and offset covers those, and keeps equality decidable
// (two dims are equal exactly when their a, s and b are). Products of two
// symbols are not representable: the front end refuses such a graph with a
// message that names the dimension.
#ifndef TERN_COMPILER_IR_DIM_H_
#define TERN_COMPILER_IR_DIM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tern::compiler {

// A symbolic size, by index in Graph::symbols.
struct Symbol {
  std::string name;  // "s0", unique in its graph
  int64_t min = 1;   // inclusive, >= 0
  int64_t max = 1;   // inclusive, >= min
};

class Dim {
 public:
  Dim() = default;
  // A constant.
  static Dim Constant(int64_t value) { return Dim(-1, 0, value); }
  // factor * symbol + offset; factor 0 is the constant `offset`.
  static Dim Affine(int32_t symbol, int64_t factor, int64_t offset) {
    return factor == 0 ? Constant(offset) : Dim(symbol, factor, offset);
  }
  static Dim Of(int32_t symbol) { return Affine(symbol, 1, 0); }

  bool is_constant() const { return symbol_ < 0; }
  // The value when constant.
  std::optional<int64_t> constant() const {
    return is_constant() ? std::optional<int64_t>(offset_) : std::nullopt;
  }
  int32_t symbol() const { return symbol_; }
  int64_t factor() const { return factor_; }
  int64_t offset() const { return offset_; }

  // The smallest and largest value over the symbol's range.
  int64_t Min(const std::vector<Symbol>& symbols) const;
  int64_t Max(const std::vector<Symbol>& symbols) const;
  // The value for the symbol values `sizes` (one per symbol).
  int64_t Evaluate(const std::vector<int64_t>& sizes) const {
    return is_constant() ? offset_ : factor_ * sizes[static_cast<size_t>(symbol_)] + offset_;
  }

  // d * k, d + k; nullopt when the result is not of the form a*s + b (never
  // here: these stay affine) or would overflow.
  std::optional<Dim> Times(int64_t k) const;
  std::optional<Dim> Plus(int64_t k) const;
  // this * other when at most one of them is symbolic; nullopt otherwise.
  std::optional<Dim> Times(const Dim& other) const;
  // this / k when it divides evenly for every value of the symbol.
  std::optional<Dim> DividedBy(int64_t k) const;

  bool operator==(const Dim& other) const = default;

  // "12", "s0", "12*s0+4" (symbol names from `symbols`).
  std::string ToString(const std::vector<Symbol>& symbols) const;

 private:
  Dim(int32_t symbol, int64_t factor, int64_t offset)
      : symbol_(symbol), factor_(factor), offset_(offset) {}
  int32_t symbol_ = -1;
  int64_t factor_ = 0;
  int64_t offset_ = 0;
};

using Shape = std::vector<Dim>;

// "[2, s0, 64]".
std::string ShapeString(const Shape& shape, const std::vector<Symbol>& symbols);

// The number of elements when every dim is constant.
std::optional<int64_t> ConstantElements(const Shape& shape);

// Each dim's constant part: the sizes of a shape the compiler has made
// static (bind_symbols.h), as lowering and emission use them.
std::vector<int64_t> StaticSizes(const Shape& shape);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_IR_DIM_H_
