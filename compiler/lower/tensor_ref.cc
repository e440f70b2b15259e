#include "compiler/lower/tensor_ref.h"

#include <utility>

#include "tern/isa.h"

namespace tern::compiler {

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

int64_t TensorRef::Elements() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

bool TensorRef::IsContiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;  // any stride is fine for a dim of size 1
    if (shape[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

TensorRef TensorRef::Contiguous(BufferRef buffer, tern_dtype_t dtype, std::vector<int64_t> shape) {
  TensorRef ref;
  ref.buffer = buffer;
  ref.dtype = dtype;
  ref.strides = ContiguousStrides(shape);
  ref.shape = std::move(shape);
  return ref;
}

TensorRef TensorRef::Permute(const std::vector<int64_t>& dims) const {
  TensorRef out = *this;
  for (size_t i = 0; i < dims.size(); ++i) {
    out.shape[i] = shape[static_cast<size_t>(dims[i])];
    out.strides[i] = strides[static_cast<size_t>(dims[i])];
  }
  return out;
}

std::optional<TensorRef> TensorRef::BroadcastTo(const std::vector<int64_t>& target) const {
  if (target.size() < shape.size()) return std::nullopt;
  TensorRef out = *this;
  out.shape = target;
  out.strides.assign(target.size(), 0);
  const size_t lead = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == target[lead + i]) {
      out.strides[lead + i] = strides[i];
    } else if (shape[i] != 1) {
      return std::nullopt;
    }
  }
  return out;
}

TensorRef TensorRef::Slice(int64_t dim, int64_t start, int64_t length, int64_t step) const {
  TensorRef out = *this;
  const size_t d = static_cast<size_t>(dim);
  out.offset += start * strides[d];
  out.shape[d] = length;
  out.strides[d] = strides[d] * step;
  return out;
}

TensorRef TensorRef::Select(int64_t dim, int64_t index) const {
  TensorRef out = *this;
  const size_t d = static_cast<size_t>(dim);
  out.offset += index * strides[d];
  out.shape.erase(out.shape.begin() + static_cast<ptrdiff_t>(d));
  out.strides.erase(out.strides.begin() + static_cast<ptrdiff_t>(d));
  return out;
}

TensorRef TensorRef::Unsqueeze(int64_t dim) const {
  TensorRef out = *this;
  const size_t d = static_cast<size_t>(dim);
  // The stride of a size-1 dim is never used to step; keep it row-major-like.
  const int64_t stride = d < shape.size() ? shape[d] * strides[d] : 1;
  out.shape.insert(out.shape.begin() + static_cast<ptrdiff_t>(d), 1);
  out.strides.insert(out.strides.begin() + static_cast<ptrdiff_t>(d), stride);
  return out;
}

TensorRef TensorRef::Squeeze(const std::vector<int64_t>& dims) const {
  TensorRef out = *this;
  out.shape.clear();
  out.strides.clear();
  for (size_t i = 0; i < shape.size(); ++i) {
    bool drop = false;
    for (int64_t d : dims) drop = drop || (static_cast<size_t>(d) == i && shape[i] == 1);
    if (drop) continue;
    out.shape.push_back(shape[i]);
    out.strides.push_back(strides[i]);
  }
  return out;
}

std::optional<TensorRef> TensorRef::Reshape(const std::vector<int64_t>& target) const {
  TensorRef out = *this;
  out.shape = target;
  if (IsContiguous() || Elements() == 0) {
    out.strides = ContiguousStrides(target);
    return out;
  }
  // Cut the source into chunks of dims that step through memory as one
  // (stride[i] == stride[i+1] * shape[i+1]); each chunk must be covered by
  // whole target dims, which then step by the chunk's innermost stride.
  struct Chunk {
    int64_t size;
    int64_t inner_stride;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!chunks.empty() && chunks.back().inner_stride == strides[i] * shape[i]) {
      chunks.back().size *= shape[i];
      chunks.back().inner_stride = strides[i];
    } else {
      chunks.push_back({shape[i], strides[i]});
    }
  }
  out.strides.assign(target.size(), 1);
  size_t next = 0;  // the next target dim to place
  for (const Chunk& chunk : chunks) {
    // Target dims [first, next) cover this chunk exactly.
    const size_t first = next;
    int64_t product = 1;
    while (next < target.size() && product < chunk.size) {
      product *= target[next];
      ++next;
    }
    if (product != chunk.size) return std::nullopt;
    int64_t stride = chunk.inner_stride;
    for (size_t i = next; i-- > first;) {
      out.strides[i] = stride;
      stride *= target[i];
    }
    // Size-1 target dims right after the chunk belong to it too.
    while (next < target.size() && target[next] == 1) ++next;
  }
  for (; next < target.size(); ++next) {
    if (target[next] != 1) return std::nullopt;
  }
  return out;
}

ByteExtent ExtentOf(const TensorRef& ref) {
  const uint64_t size = tern_dtype_size(ref.dtype);
  int64_t last = 0;  // element offset of the furthest element
  for (size_t i = 0; i < ref.shape.size(); ++i) {
    if (ref.shape[i] == 0) return {0, 0};
    last += (ref.shape[i] - 1) * ref.strides[i];
  }
  const uint64_t first = static_cast<uint64_t>(ref.offset) * size;
  return {first, first + (static_cast<uint64_t>(last) + 1) * size};
}

}  // namespace tern::compiler
