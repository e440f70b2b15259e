// The verifier: whether a graph is well formed and every node is what its
// operator allows. Front ends and the graph-file reader call it before
// handing a graph to the passes; passes may call it in tests.
#ifndef TERN_COMPILER_IR_VERIFY_H_
#define TERN_COMPILER_IR_VERIFY_H_

#include <absl/status/status.h>

#include "compiler/ir/graph.h"

namespace tern::compiler {

// Checks, naming the first problem found (which value, node or attribute,
// and what to do):
// - symbols: unique non-empty names, 0 <= min <= max; every symbolic dim
//   refers to one, and its value stays >= 0 over the range;
// - values: a valid dtype; inputs listed once each in Graph::inputs at
//   their index; constants whose bytes match their (constant) shape;
//   node outputs that name their node;
// - nodes: topological (inputs defined before use), a known op with its
//   arity, attribute names unique and sorted, and output types equal to
//   what inference gives;
// - outputs and mutations: valid values and positions, unique output
//   names; a mutation pairs an input with an output of the same type.
// Thread-safety: a pure function of its argument.
absl::Status VerifyGraph(const Graph& graph);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_IR_VERIFY_H_
