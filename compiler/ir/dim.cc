#include "compiler/ir/dim.h"

#include <fmt/format.h>

#include <cstdint>

namespace tern::compiler {
namespace {

std::optional<int64_t> Multiply(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::optional<int64_t> Add(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace

namespace {

// factor * value + offset, saturated to the int64 range: hostile graphs may
// declare dims that overflow, and the verifier must see them as out of range
// rather than wrap.
int64_t Saturated(int64_t factor, int64_t value, int64_t offset) {
  const __int128 exact = static_cast<__int128>(factor) * value + offset;
  if (exact > INT64_MAX) return INT64_MAX;
  if (exact < INT64_MIN) return INT64_MIN;
  return static_cast<int64_t>(exact);
}

}  // namespace

int64_t Dim::Min(const std::vector<Symbol>& symbols) const {
  if (is_constant()) return offset_;
  const Symbol& s = symbols[static_cast<size_t>(symbol_)];
  return Saturated(factor_, factor_ > 0 ? s.min : s.max, offset_);
}

int64_t Dim::Max(const std::vector<Symbol>& symbols) const {
  if (is_constant()) return offset_;
  const Symbol& s = symbols[static_cast<size_t>(symbol_)];
  return Saturated(factor_, factor_ > 0 ? s.max : s.min, offset_);
}

std::optional<Dim> Dim::Times(int64_t k) const {
  const auto factor = Multiply(factor_, k);
  const auto offset = Multiply(offset_, k);
  if (!factor || !offset) return std::nullopt;
  return is_constant() ? Constant(*offset) : Affine(symbol_, *factor, *offset);
}

std::optional<Dim> Dim::Plus(int64_t k) const {
  const auto offset = Add(offset_, k);
  if (!offset) return std::nullopt;
  return is_constant() ? Constant(*offset) : Affine(symbol_, factor_, *offset);
}

std::optional<Dim> Dim::Times(const Dim& other) const {
  if (other.is_constant()) return Times(other.offset_);
  if (is_constant()) return other.Times(offset_);
  return std::nullopt;
}

std::optional<Dim> Dim::DividedBy(int64_t k) const {
  if (k == 0 || factor_ % k != 0 || offset_ % k != 0) return std::nullopt;
  return is_constant() ? Constant(offset_ / k) : Affine(symbol_, factor_ / k, offset_ / k);
}

std::string Dim::ToString(const std::vector<Symbol>& symbols) const {
  if (is_constant()) return std::to_string(offset_);
  const std::string name = static_cast<size_t>(symbol_) < symbols.size()
                               ? symbols[static_cast<size_t>(symbol_)].name
                               : fmt::format("<symbol {}>", symbol_);
  std::string text = factor_ == 1 ? name : fmt::format("{}*{}", factor_, name);
  if (offset_ > 0) text += fmt::format("+{}", offset_);
  if (offset_ < 0) text += fmt::format("{}", offset_);
  return text;
}

std::string ShapeString(const Shape& shape, const std::vector<Symbol>& symbols) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += shape[i].ToString(symbols);
  }
  return text + "]";
}

std::vector<int64_t> StaticSizes(const Shape& shape) {
  std::vector<int64_t> sizes;
  sizes.reserve(shape.size());
  for (const Dim& dim : shape) sizes.push_back(dim.offset());
  return sizes;
}

std::optional<int64_t> ConstantElements(const Shape& shape) {
  int64_t count = 1;
  for (const Dim& dim : shape) {
    if (!dim.is_constant()) return std::nullopt;
    const auto product = Multiply(count, *dim.constant());
    if (!product) return std::nullopt;
    count = *product;
  }
  return count;
}

}  // namespace tern::compiler
