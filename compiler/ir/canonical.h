// The canonical serialisation of graph pieces: fixed-width native-endian
// fields, length-prefixed strings, dims, tensor types and attributes (doubles
// by their bits). The graph hash (hash.h) hashes it; common-subexpression
// elimination (compiler/passes/cse.h) compares nodes by it.
#ifndef TERN_COMPILER_IR_CANONICAL_H_
#define TERN_COMPILER_IR_CANONICAL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "compiler/ir/graph.h"

namespace tern::compiler {

// Thread-safety: one object per thread.
class CanonicalBytes {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>);
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    data_.append(bytes, sizeof(T));
  }
  void Put(std::string_view text) {
    Put<uint64_t>(text.size());
    data_.append(text);
  }
  void Put(const std::string& text) { Put(std::string_view(text)); }
  void Put(const Dim& dim) {
    Put<int32_t>(dim.symbol());
    Put<int64_t>(dim.factor());
    Put<int64_t>(dim.offset());
  }
  void Put(const TensorType& type) {
    Put<uint32_t>(type.dtype);
    Put<uint64_t>(type.shape.size());
    for (const Dim& dim : type.shape) Put(dim);
  }
  void Put(const Attribute& attr) {
    Put(attr.name);
    Put<uint64_t>(attr.value.index());
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            Put<uint64_t>(v.size());
            for (int64_t x : v) Put<int64_t>(x);
          } else if constexpr (std::is_same_v<T, Shape>) {
            Put<uint64_t>(v.size());
            for (const Dim& d : v) Put(d);
          } else if constexpr (std::is_same_v<T, std::string>) {
            Put(v);
          } else if constexpr (std::is_same_v<T, DTypeAttr>) {
            Put<uint32_t>(v.dtype);
          } else {
            Put(v);  // int64_t, double (its bits), bool
          }
        },
        attr.value);
  }

  const std::string& data() const { return data_; }
  std::string Take() { return std::move(data_); }

 private:
  std::string data_;
};

}  // namespace tern::compiler

#endif  // TERN_COMPILER_IR_CANONICAL_H_
