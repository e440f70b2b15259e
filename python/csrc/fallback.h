// The CPU fallback for every operator without a native tern kernel, and the
// log of which operators took it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace torch_tern {

// Operator name ("aten::add.Tensor") -> times it ran through the fallback.
std::map<std::string, int64_t> FallbackOps();
void ClearFallbackOps();

}  // namespace torch_tern
