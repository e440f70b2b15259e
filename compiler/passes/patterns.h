// Pattern replacement: recognises normalisations and activations that
// exporters write out as chains of core ATen ops (HF transformers through
// torch.export and the core ATen decompositions) and replaces each chain by
// the single op the ISA runs in one instruction:
//
// - tanh-GELU, 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) (GPT-2's
//   "gelu_new"), -> aten.gelu.default approximate="tanh";
// - erf-GELU, 0.5*x*(1+erf(x/sqrt(2))) -> aten.gelu.default;
// - RMSNorm as LLaMA writes it, w * (x * rsqrt(mean(x^2, last dims) + eps)),
//   -> aten.rms_norm.default;
// - softmax, exp(x-amax)/sum(exp(x-amax)) -> aten._softmax.default, and
//   log-softmax, (x-amax) - log(sum(exp(x-amax))) -> aten._log_softmax.default;
// - LayerNorm written out, (x-mean)/sqrt(var+eps)*w+b (or * rsqrt)
//   -> aten.native_layer_norm.default.
//
// A chain is replaced only when every intermediate value is read by the
// chain alone (not by another node, not a graph output, so not a mutation),
// every value of the chain has the type the pattern needs (docs/compiler.md,
// "Patterns", has the exact conditions) and the constants are the pattern's:
// 0.5, 1.0, 2 and 3 exactly, 0.044715, sqrt(2/pi), 1/sqrt(2) and sqrt(2)
// equal once rounded to f32. The chain's last node becomes the new op (its
// output value, name and source stay); the others are dropped, and the
// graph is renumbered densely (graph_edit.h). Deterministic: larger
// patterns win, tried from the graph's last node backwards.
#ifndef TERN_COMPILER_PASSES_PATTERNS_H_
#define TERN_COMPILER_PASSES_PATTERNS_H_

#include <absl/status/statusor.h>

#include <cstdint>

#include "compiler/ir/graph.h"

namespace tern::compiler {

struct PatternStats {
  uint32_t gelu_tanh = 0;
  uint32_t gelu_erf = 0;
  uint32_t rms_norm = 0;
  uint32_t softmax = 0;
  uint32_t log_softmax = 0;
  uint32_t layer_norm = 0;
  uint32_t nodes_removed = 0;  // nodes of the replaced chains other than their last

  uint32_t replaced() const {
    return gelu_tanh + gelu_erf + rms_norm + softmax + log_softmax + layer_norm;
  }
};

// Replaces every chain that matches in `graph`. Errors are internal (a bug in
// the pass); the graph may then be partly rewritten.
absl::StatusOr<PatternStats> ReplacePatterns(Graph* graph);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_PASSES_PATTERNS_H_
