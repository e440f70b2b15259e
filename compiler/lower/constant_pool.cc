#include "compiler/lower/constant_pool.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "common/half_float.h"

namespace tern::compiler {
namespace {

template <typename T>
std::vector<uint8_t> BytesOf(T value) {
  std::vector<uint8_t> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

}  // namespace

uint32_t ConstantPool::Add(const std::vector<uint8_t>& bytes) {
  std::string key(bytes.begin(), bytes.end());
  auto found = index_.find(key);
  if (found != index_.end()) {
    deduplicated_bytes_ += bytes.size();
    return found->second;
  }
  const uint32_t entry = static_cast<uint32_t>(entries_.size());
  entries_.push_back(bytes);
  index_.emplace(std::move(key), entry);
  stored_bytes_ += bytes.size();
  return entry;
}

uint32_t ConstantPool::AddScalar(double value, tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return Add(BytesOf(static_cast<float>(value)));
    case TERN_DTYPE_BF16:
      return Add(BytesOf(F32ToBf16(static_cast<float>(value))));
    case TERN_DTYPE_F16:
      return Add(BytesOf(F32ToF16(static_cast<float>(value))));
    default:
      return AddInt(static_cast<int64_t>(value), dtype);
  }
}

uint32_t ConstantPool::AddInt(int64_t value, tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_I8:
      return Add(BytesOf(static_cast<int8_t>(value)));
    case TERN_DTYPE_I32:
      return Add(BytesOf(static_cast<int32_t>(value)));
    case TERN_DTYPE_I64:
      return Add(BytesOf(value));
    case TERN_DTYPE_BOOL:
      return Add(BytesOf(static_cast<uint8_t>(value != 0)));
    default:
      return AddScalar(static_cast<double>(value), dtype);
  }
}

}  // namespace tern::compiler
