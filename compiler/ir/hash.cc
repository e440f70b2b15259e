#include "compiler/ir/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string>
#include <vector>

#include "compiler/ir/canonical.h"

namespace tern::compiler {
namespace {

// The hash of a constant's bytes (with their count) in place of the bytes.
void PutBytes(const std::vector<uint8_t>& bytes, CanonicalBytes* out) {
  out->Put<uint64_t>(bytes.size());
  out->Put<uint64_t>(XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace

uint64_t GraphHash(const Graph& graph) {
  CanonicalBytes out;
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
        PutBytes(graph.constants[value.index], &out);
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
  return XXH3_64bits(out.data().data(), out.data().size());
}

}  // namespace tern::compiler
