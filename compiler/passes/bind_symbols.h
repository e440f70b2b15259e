// Symbol binding: gives symbolic sizes (dim.h) their values, so that a graph
// exported with dynamic shapes compiles for one static shape.
//
// Every dim a*s+b of a bound symbol s becomes the constant a*value+b, in
// value types and in Shape attributes (a view's or an expand's size); the
// bound symbols leave Graph::symbols and the others are renumbered in their
// order. Each value must lie in its symbol's declared range.
#ifndef TERN_COMPILER_PASSES_BIND_SYMBOLS_H_
#define TERN_COMPILER_PASSES_BIND_SYMBOLS_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "compiler/ir/graph.h"

namespace tern::compiler {

// Symbol name -> value: {{"s0", 128}, {"s1", 4}}.
using SymbolBindings = std::map<std::string, int64_t, std::less<>>;

struct BindOptions {
  // Fail when a symbol that some dim uses is left unbound (symbols nothing
  // uses are dropped then); the result then has no symbols.
  bool require_static = false;
};

// Binds `bindings` in a copy of `graph` (which should have passed
// VerifyGraph; so does the result, inference giving the same types for the
// bound sizes). Errors (InvalidArgument), the graph unchanged:
// - a name the graph does not declare: "cannot bind 'n': the graph has no
//   symbol of that name (its symbols: s0 in [1, 512])";
// - a value outside the range: "cannot bind s0 = 1000: s0 must be in
//   [1, 512] (its declared range)";
// - a dim that overflows or becomes negative with that value;
// - with require_static, the symbols still unbound, with their ranges.
// Thread-safety: a pure function of its arguments.
absl::StatusOr<Graph> BindSymbols(const Graph& graph, const SymbolBindings& bindings,
                                  const BindOptions& options = {});

// The same, in place (no copy of the constants); on error `graph` is
// unchanged.
absl::Status BindSymbolsInPlace(Graph* graph, const SymbolBindings& bindings,
                                const BindOptions& options = {});

}  // namespace tern::compiler

#endif  // TERN_COMPILER_PASSES_BIND_SYMBOLS_H_
