#include "compiler/passes/bind_symbols.h"

#include <fmt/format.h>

#include <optional>
#include <variant>
#include <vector>

namespace tern::compiler {
namespace {

std::string SymbolList(const std::vector<Symbol>& symbols, const std::vector<bool>* only) {
  std::string text;
  for (size_t i = 0; i < symbols.size(); ++i) {
    if (only != nullptr && !(*only)[i]) continue;
    if (!text.empty()) text += ", ";
    text += fmt::format("{} in [{}, {}]", symbols[i].name, symbols[i].min, symbols[i].max);
  }
  return text.empty() ? "none" : text;
}

// How each old symbol maps: a value, or a new index.
struct Plan {
  std::vector<std::optional<int64_t>> value;
  std::vector<int32_t> new_index;  // -1: bound or dropped
  std::vector<Symbol> symbols;     // the symbols left
};

// The dim with the plan applied, or an error naming the dim and `where`.
absl::StatusOr<Dim> Substitute(const Dim& dim, const Plan& plan, const std::vector<Symbol>& old,
                               const std::string& where) {
  if (dim.is_constant()) return dim;
  const size_t s = static_cast<size_t>(dim.symbol());
  if (s >= plan.value.size()) {
    return absl::InvalidArgumentError(
        fmt::format("{} has a dim of symbol {}, which the graph does not declare", where, s));
  }
  if (!plan.value[s]) return Dim::Affine(plan.new_index[s], dim.factor(), dim.offset());
  int64_t product = 0, sum = 0;
  const bool overflow = __builtin_mul_overflow(dim.factor(), *plan.value[s], &product) ||
                        __builtin_add_overflow(product, dim.offset(), &sum);
  if (overflow || sum < 0) {
    return absl::InvalidArgumentError(fmt::format(
        "cannot bind {} = {}: {} has the dim {}, which would be {}", old[s].name, *plan.value[s],
        where, dim.ToString(old), overflow ? "out of the int64 range" : std::to_string(sum)));
  }
  return Dim::Constant(sum);
}

absl::Status SubstituteShape(Shape* shape, const Plan& plan, const std::vector<Symbol>& old,
                             const std::string& where) {
  for (Dim& dim : *shape) {
    absl::StatusOr<Dim> bound = Substitute(dim, plan, old, where);
    if (!bound.ok()) return bound.status();
    dim = *bound;
  }
  return absl::OkStatus();
}

// Applies the plan to every dim of `graph` (a copy when called from
// BindSymbolsInPlace, so that an error leaves the caller's graph as it was).
absl::Status Apply(Graph* graph, const Plan& plan) {
  const std::vector<Symbol> old = graph->symbols;
  for (uint32_t id = 0; id < graph->values.size(); ++id) {
    Value& value = graph->values[id];
    bool symbolic = false;
    for (const Dim& d : value.type.shape) symbolic = symbolic || !d.is_constant();
    if (!symbolic) continue;
    if (absl::Status s = SubstituteShape(&value.type.shape, plan, old,
                                         fmt::format("value {} ('{}')", id, value.name));
        !s.ok()) {
      return s;
    }
  }
  for (Node& node : graph->nodes) {
    for (Attribute& attr : node.attrs) {
      if (Shape* shape = std::get_if<Shape>(&attr.value)) {
        if (absl::Status s =
                SubstituteShape(shape, plan, old,
                                fmt::format("{}'s attribute '{}'", DescribeNode(node), attr.name));
            !s.ok()) {
          return s;
        }
      }
    }
  }
  graph->symbols = plan.symbols;
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(const Graph& graph, const SymbolBindings& bindings,
                              const BindOptions& options) {
  const std::vector<Symbol>& symbols = graph.symbols;
  Plan plan;
  plan.value.assign(symbols.size(), std::nullopt);
  plan.new_index.assign(symbols.size(), -1);
  for (const auto& [name, value] : bindings) {
    size_t s = 0;
    while (s < symbols.size() && symbols[s].name != name) ++s;
    if (s == symbols.size()) {
      return absl::InvalidArgumentError(
          fmt::format("cannot bind '{}': the graph has no symbol of that name (its symbols: {})",
                      name, SymbolList(symbols, nullptr)));
    }
    if (value < symbols[s].min || value > symbols[s].max) {
      return absl::InvalidArgumentError(
          fmt::format("cannot bind {} = {}: {} must be in [{}, {}] (its declared range)", name,
                      value, name, symbols[s].min, symbols[s].max));
    }
    plan.value[s] = value;
  }
  // Which unbound symbols some dim still uses.
  std::vector<bool> used(symbols.size(), false);
  auto mark = [&](const Shape& shape) {
    for (const Dim& d : shape) {
      if (!d.is_constant() && static_cast<size_t>(d.symbol()) < used.size()) {
        used[static_cast<size_t>(d.symbol())] = true;
      }
    }
  };
  for (const Value& value : graph.values) mark(value.type.shape);
  for (const Node& node : graph.nodes) {
    for (const Attribute& attr : node.attrs) {
      if (const Shape* shape = std::get_if<Shape>(&attr.value)) mark(*shape);
    }
  }
  std::vector<bool> unbound(symbols.size(), false);
  bool any_unbound = false;
  for (size_t s = 0; s < symbols.size(); ++s) {
    unbound[s] = !plan.value[s] && used[s];
    any_unbound = any_unbound || unbound[s];
  }
  if (options.require_static && any_unbound) {
    return absl::InvalidArgumentError(fmt::format(
        "the graph's symbolic sizes {} are not bound; a static graph needs a value for each "
        "(ternc compile --bind NAME=VALUE)",
        SymbolList(symbols, &unbound)));
  }
  for (size_t s = 0; s < symbols.size(); ++s) {
    if (plan.value[s] || (options.require_static && !used[s])) continue;
    plan.new_index[s] = static_cast<int32_t>(plan.symbols.size());
    plan.symbols.push_back(symbols[s]);
  }
  return plan;
}

}  // namespace

absl::StatusOr<Graph> BindSymbols(const Graph& graph, const SymbolBindings& bindings,
                                  const BindOptions& options) {
  absl::StatusOr<Plan> plan = MakePlan(graph, bindings, options);
  if (!plan.ok()) return plan.status();
  Graph bound = graph;
  if (absl::Status s = Apply(&bound, *plan); !s.ok()) return s;
  return bound;
}

absl::Status BindSymbolsInPlace(Graph* graph, const SymbolBindings& bindings,
                                const BindOptions& options) {
  absl::StatusOr<Plan> plan = MakePlan(*graph, bindings, options);
  if (!plan.ok()) return plan.status();
  // Substitute into copies of the types and attributes only (not the
  // constants), then swap them in.
  Graph shell;
  shell.symbols = graph->symbols;
  shell.values = graph->values;
  shell.nodes = graph->nodes;
  if (absl::Status s = Apply(&shell, *plan); !s.ok()) return s;
  graph->symbols = std::move(shell.symbols);
  graph->values = std::move(shell.values);
  graph->nodes = std::move(shell.nodes);
  return absl::OkStatus();
}

}  // namespace tern::compiler
