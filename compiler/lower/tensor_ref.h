// A tensor as lowering sees it: a buffer (an input, an output, a constant,
// a scratch region or nothing) and a strided window into it. View ops
// (permute, expand, slice, select, ...) only transform this window, so they
// cost no instruction: the consumer's operand carries the offset and strides.
#ifndef TERN_COMPILER_LOWER_TENSOR_REF_H_
#define TERN_COMPILER_LOWER_TENSOR_REF_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "tern/isa.h"

namespace tern::compiler {

struct BufferRef {
  enum Kind : uint8_t { kNone = 0, kInput, kOutput, kConstant, kScratch };
  Kind kind = kNone;
  // kInput/kOutput: the function's input/output index; kConstant: the
  // ConstantPool entry; kScratch: the scratch buffer id (before planning).
  uint32_t index = 0;
  bool operator==(const BufferRef& other) const = default;
};

struct TensorRef {
  BufferRef buffer;
  int64_t offset = 0;  // elements of `dtype` from the buffer's start
  tern_dtype_t dtype = TERN_DTYPE_F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements; 0 repeats (broadcast)

  bool present() const { return buffer.kind != BufferRef::kNone; }
  int64_t Elements() const;
  bool IsContiguous() const;

  // A contiguous tensor of `shape` at the start of `buffer`.
  static TensorRef Contiguous(BufferRef buffer, tern_dtype_t dtype, std::vector<int64_t> shape);
  // An absent optional operand.
  static TensorRef None() { return TensorRef{}; }

  // The view ops. Dims are already normalised (0 <= dim < rank) by callers.
  TensorRef Permute(const std::vector<int64_t>& dims) const;
  // numpy broadcasting to `shape` (new leading dims and size-1 dims get
  // stride 0); nullopt when the shapes are not broadcast-compatible.
  std::optional<TensorRef> BroadcastTo(const std::vector<int64_t>& shape) const;
  TensorRef Slice(int64_t dim, int64_t start, int64_t length, int64_t step) const;
  TensorRef Select(int64_t dim, int64_t index) const;
  TensorRef Unsqueeze(int64_t dim) const;
  // Drops the listed dims of size 1 (others stay, as torch.squeeze does).
  TensorRef Squeeze(const std::vector<int64_t>& dims) const;
  // The same elements with another shape (Tensor.view) when the strides can
  // express it without a copy; nullopt otherwise.
  std::optional<TensorRef> Reshape(const std::vector<int64_t>& shape) const;
};

// Row-major strides of `shape`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

// The byte range [first, end) an operand can touch relative to its buffer's
// start; first == end when it has no elements.
struct ByteExtent {
  uint64_t first = 0;
  uint64_t end = 0;
};
ByteExtent ExtentOf(const TensorRef& ref);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_TENSOR_REF_H_
