#include "compiler/passes/cse.h"

#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>

#include <string>
#include <vector>

#include "compiler/ir/canonical.h"
#include "compiler/passes/graph_edit.h"

namespace tern::compiler {
namespace {

// The base name of an op: "add_" for "aten.add_.Tensor".
std::string_view BaseName(std::string_view op) {
  const size_t first = op.find('.');
  if (first == std::string_view::npos) return op;
  std::string_view rest = op.substr(first + 1);
  const size_t second = rest.find('.');
  return second == std::string_view::npos ? rest : rest.substr(0, second);
}

bool SameConstant(const Graph& graph, uint32_t a, uint32_t b) {
  const Value &va = graph.values[a], &vb = graph.values[b];
  return va.type == vb.type && graph.constants[va.index] == graph.constants[vb.index];
}

}  // namespace

bool MayMerge(std::string_view op) {
  const std::string_view base = BaseName(op);
  if (base.empty() || base.back() == '_') return false;  // in place: add_, copy_, ...
  static constexpr std::string_view kNever[] = {
      // random numbers
      "rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "exponential", "cauchy",
      "geometric", "poisson", "random",
      // uninitialised memory, side effects, data-dependent host syncs
      "empty", "_assert", "print", "_local_scalar_dense", "sym_constrain", "_foreach"};
  for (std::string_view word : kNever) {
    if (base.find(word) != std::string_view::npos) return false;
  }
  return true;
}

absl::StatusOr<CseStats> EliminateCommonSubexpressions(Graph* graph) {
  passes_internal::GraphEdit edit(*graph);
  CseStats stats;

  // Constants: bucketed by a hash of type and bytes, compared in full.
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> constants;
  for (uint32_t id = 0; id < graph->values.size(); ++id) {
    const Value& value = graph->values[id];
    if (value.kind != Value::kConstant) continue;
    const std::vector<uint8_t>& bytes = graph->constants[value.index];
    CanonicalBytes type;
    type.Put(value.type);
    const uint64_t hash = absl::HashOf(
        type.Take(), std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    std::vector<uint32_t>& bucket = constants[hash];
    bool merged = false;
    for (uint32_t earlier : bucket) {
      if (SameConstant(*graph, earlier, id)) {
        edit.Replace(id, earlier);
        edit.DropConstant(id);
        ++stats.constants_merged;
        merged = true;
        break;
      }
    }
    if (!merged) bucket.push_back(id);
  }

  // Nodes, in order: inputs are resolved through the merges made so far.
  absl::flat_hash_map<std::string, uint32_t> seen;
  seen.reserve(graph->nodes.size());
  for (uint32_t n = 0; n < graph->nodes.size(); ++n) {
    const Node& node = graph->nodes[n];
    if (!MayMerge(node.op)) continue;
    // The node's identity: op, inputs (resolved), attributes, output types.
    CanonicalBytes key;
    key.Put(std::string_view(node.op));
    key.Put<uint64_t>(node.inputs.size());
    for (uint32_t id : node.inputs) key.Put<uint32_t>(edit.Resolve(id));
    key.Put<uint64_t>(node.attrs.size());
    for (const Attribute& attr : node.attrs) key.Put(attr);
    key.Put<uint64_t>(node.outputs.size());
    for (uint32_t id : node.outputs) key.Put(graph->values[id].type);
    auto [it, inserted] = seen.try_emplace(key.Take(), n);
    if (inserted) continue;
    const Node& earlier = graph->nodes[it->second];
    for (size_t o = 0; o < node.outputs.size(); ++o)
      edit.Replace(node.outputs[o], earlier.outputs[o]);
    edit.DropNode(n);
    ++stats.nodes_merged;
  }
  if (absl::Status status = edit.Apply(graph); !status.ok()) return status;
  return stats;
}

}  // namespace tern::compiler
