// Constant folding: a node whose inputs are all constants is evaluated on
// the host, exactly as PyTorch computes it, and replaced by a constant.
//
// The ops (their names in compiler/ir/ops.cc; t, transpose.int, reshape,
// alias and squeeze.dim/default are evaluated too, for when the table
// learns them):
// - layout: view, _unsafe_view, permute, expand, slice.Tensor, select.int,
//   unsqueeze, squeeze.dims, clone, and _to_copy without a dtype change;
// - data movement: cat (pieces of other dtypes converted as _to_copy does),
//   _to_copy between f32, bf16 and f16 with round-to-nearest-even (a NaN
//   narrowed is not folded: PyTorch's scalar and vector paths give it other
//   bits), and to or from an integer or bool when every value is exact;
// - f32 arithmetic: add, sub, mul, div (.Tensor and .Scalar, broadcasting,
//   a Python number converted to float first as PyTorch's kernels do;
//   add/sub only with alpha 1: PyTorch fuses alpha * other + self on some
//   paths) and neg. Host float arithmetic is IEEE binary32, as PyTorch's.
//
// Limits: a node is not folded when its result would be more than
// `max_growth` times the bytes of its (distinct) inputs or more than
// `max_bytes` (an expand of a scalar into a big tensor stays a broadcast
// view). A layout-only node is folded only when a folded node reads it
// (unless `fold_layout_leaves`): lowering already turns a view of a constant
// into a strided operand at no cost, and a folded copy would only store the
// weight a second time (a transposed weight next to the original). Nodes
// with symbolic output shapes and multi-output nodes are not folded.
//
// A folded constant is named after the value it replaces (the node's name).
// The nodes left without users (the folded node's inputs) are for dead-code
// elimination to remove. Deterministic; folding an already folded graph
// changes nothing.
#ifndef TERN_COMPILER_PASSES_CONSTANT_FOLD_H_
#define TERN_COMPILER_PASSES_CONSTANT_FOLD_H_

#include <absl/status/statusor.h>

#include <cstdint>

#include "compiler/ir/graph.h"

namespace tern::compiler {

struct FoldOptions {
  uint64_t max_bytes = 16ull << 20;  // largest folded result
  uint64_t max_growth = 4;           // result bytes <= max_growth * input bytes
  bool fold_layout_leaves = false;   // fold views nothing folded reads too
};

struct FoldStats {
  uint32_t nodes_folded = 0;        // nodes replaced by a constant
  uint32_t declined_too_large = 0;  // all-constant nodes over a size limit
  uint32_t declined_inexact = 0;    // evaluation declined (NaN narrowed, inexact cast, ...)
};

// Folds the foldable nodes of `graph` (which should have passed
// VerifyGraph). Fails only on an internal inconsistency, leaving the graph
// unchanged.
// Thread-safety: touches only `graph`.
absl::StatusOr<FoldStats> FoldConstants(Graph* graph, const FoldOptions& options = {});

}  // namespace tern::compiler

#endif  // TERN_COMPILER_PASSES_CONSTANT_FOLD_H_
