// The operator families' registration lists. Each is defined at the end of
// its family's file, next to the operators it names; register.cc calls them
// from the plugin's one TORCH_LIBRARY_IMPL per dispatch key.
#pragma once

#include <torch/library.h>

namespace torch_tern::native {

// Dispatch key PrivateUse1 (namespace aten).
void RegisterMinimalOps(torch::Library& m);      // minimal.cc
void RegisterElementwiseOps(torch::Library& m);  // elementwise.cc
void RegisterReduceOps(torch::Library& m);       // reduce.cc
void RegisterMatmulOps(torch::Library& m);       // matmul.cc
void RegisterIndexOps(torch::Library& m);        // index.cc
void RegisterPoolOps(torch::Library& m);         // pool.cc
void RegisterRandomOps(torch::Library& m);       // random.cc
void RegisterForeachOps(torch::Library& m);      // foreach.cc

// Dispatch key AutogradPrivateUse1 (namespace aten).
void RegisterReduceAutogradOps(torch::Library& m);  // reduce.cc

}  // namespace torch_tern::native
