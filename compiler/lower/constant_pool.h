// The constants of one executable: graph constants and the scalars lowering
// makes (alpha, a Python number operand), each distinct byte string stored
// once, in order of first use.
#ifndef TERN_COMPILER_LOWER_CONSTANT_POOL_H_
#define TERN_COMPILER_LOWER_CONSTANT_POOL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tern/isa.h"

namespace tern::compiler {

class ConstantPool {
 public:
  // The entry holding exactly `bytes` (added when new).
  // Thread-safety: not concurrently on one object.
  uint32_t Add(const std::vector<uint8_t>& bytes);
  // A one-element constant of `dtype` holding `value` (integers exact up to
  // 2^53 when given as double; use AddInt for wider ones).
  uint32_t AddScalar(double value, tern_dtype_t dtype);
  uint32_t AddInt(int64_t value, tern_dtype_t dtype);

  const std::vector<std::vector<uint8_t>>& entries() const { return entries_; }
  // Bytes stored (before alignment) and bytes the deduplication saved.
  uint64_t stored_bytes() const { return stored_bytes_; }
  uint64_t deduplicated_bytes() const { return deduplicated_bytes_; }

 private:
  std::vector<std::vector<uint8_t>> entries_;
  std::map<std::string, uint32_t> index_;  // bytes -> entry
  uint64_t stored_bytes_ = 0;
  uint64_t deduplicated_bytes_ = 0;
};

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_CONSTANT_POOL_H_
