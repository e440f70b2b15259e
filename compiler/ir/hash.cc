#include "compiler/ir/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace tern::compiler {
namespace {

// Appends fixed-width little-endian fields and length-prefixed strings: the
// canonical serialisation the hash is taken of.
class Canonical {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>);
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    data_.insert(data_.end(), bytes, bytes + sizeof(T));
  }
  void Put(const std::string& text) {
    Put<uint64_t>(text.size());
    data_.insert(data_.end(), text.begin(), text.end());
  }
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
            Put(v);
          }
        },
        attr.value);
  }
  void PutBytes(const std::vector<uint8_t>& bytes) {
    Put<uint64_t>(bytes.size());
    Put<uint64_t>(XXH3_64bits(bytes.data(), bytes.size()));
  }
  uint64_t Hash() const { return XXH3_64bits(data_.data(), data_.size()); }

 private:
  std::vector<uint8_t> data_;
};

}  // namespace

uint64_t GraphHash(const Graph& graph) {
  Canonical out;
  out.Put(std::string("tern graph hash 1"));
  out.Put<uint64_t>(graph.symbols.size());
  for (const Symbol& symbol : graph.symbols) {
    out.Put<int64_t>(symbol.min);
    out.Put<int64_t>(symbol.max);
  }
  // Values numbered canonically: inputs by position, then constants and
  // node outputs in the order the nodes first use or make them.
  constexpr uint32_t kUnnumbered = UINT32_MAX;
  std::vector<uint32_t> number(graph.values.size(), kUnnumbered);
  uint32_t next = 0;
  auto number_of = [&](uint32_t id) -> uint32_t {
    if (id == kNoValue) return kNoValue;
    if (number[id] == kUnnumbered) {
      number[id] = next++;
      const Value& value = graph.values[id];
      if (value.kind == Value::kConstant) {
        // A constant enters where it is first used: its type and bytes.
        out.Put<uint8_t>(1);
        out.Put(value.type);
        out.PutBytes(graph.constants[value.index]);
      }
    }
    return number[id];
  };
  out.Put<uint64_t>(graph.inputs.size());
  for (uint32_t id : graph.inputs) {
    number_of(id);
    out.Put(graph.values[id].type);
  }
  out.Put<uint64_t>(graph.nodes.size());
  for (const Node& node : graph.nodes) {
    std::vector<uint32_t> inputs;
    for (uint32_t id : node.inputs) inputs.push_back(number_of(id));
    out.Put<uint8_t>(2);
    out.Put(node.op);
    out.Put<uint64_t>(inputs.size());
    for (uint32_t n : inputs) out.Put<uint32_t>(n);
    out.Put<uint64_t>(node.attrs.size());
    for (const Attribute& attr : node.attrs) out.Put(attr);
    out.Put<uint64_t>(node.outputs.size());
    for (uint32_t id : node.outputs) {
      number_of(id);
      out.Put(graph.values[id].type);
    }
  }
  out.Put<uint64_t>(graph.outputs.size());
  for (const Graph::Output& output : graph.outputs) out.Put<uint32_t>(number_of(output.value));
  out.Put<uint64_t>(graph.mutations.size());
  for (const Graph::Mutation& mutation : graph.mutations) {
    out.Put<uint32_t>(mutation.input);
    out.Put<uint32_t>(mutation.output);
  }
  return out.Hash();
}

}  // namespace tern::compiler
