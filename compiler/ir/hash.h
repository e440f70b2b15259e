// The canonical hash of a graph: equal for graphs that compute the same
// thing in the same way, whatever their names and debug information, so
// that the compile cache (key: this hash + compiler version + target +
// options) serves a graph that was exported again unchanged.
//
// What enters: symbols' ranges (not names), the inputs' and outputs' types
// and order, the mutations, every node's op, inputs (by their position in
// the graph's definition order, not by value id), attributes and output
// types, and the constants' bytes. What does not: value, node, input and
// output names, source locations. Input and output *names* are part of an
// executable's signature, so the cache key adds them separately.
#ifndef TERN_COMPILER_IR_HASH_H_
#define TERN_COMPILER_IR_HASH_H_

#include <cstdint>

#include "compiler/ir/graph.h"

namespace tern::compiler {

// 64-bit XXH3 of the graph's canonical serialisation. The graph must have
// passed VerifyGraph. Thread-safety: a pure function of its argument.
uint64_t GraphHash(const Graph& graph);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_IR_HASH_H_
