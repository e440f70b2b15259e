// Every operator reaching the PrivateUse1 key without a tern kernel lands in
// this boxed fallback: it is counted under its full name, then runs on the
// CPU (at::native::cpu_fallback moves the arguments to the CPU and the
// results back, through the plugin's own copies).
//
// TORCH_TERN_FALLBACK (read on every fallback, so tests can flip it):
//   unset / "allow"  run on the CPU silently (default)
//   "warn"           also warn, once per operator
//   "error"          raise instead, naming the operator
#include "aten/fallback.h"

#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torch_tern {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, int64_t>* g_counts = new std::unordered_map<std::string, int64_t>();
std::unordered_set<std::string>* g_warned = new std::unordered_set<std::string>();

std::string OperatorName(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

}  // namespace

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = OperatorName(op);
  const char* mode = std::getenv("TORCH_TERN_FALLBACK");
  bool warn = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    ++(*g_counts)[name];
    if (mode != nullptr && std::strcmp(mode, "warn") == 0) warn = g_warned->insert(name).second;
  }
  if (mode != nullptr && std::strcmp(mode, "error") == 0) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_tern: operator '", name,
                                "' has no native tern kernel and TORCH_TERN_FALLBACK=error "
                                "forbids running it on the CPU");
  }
  if (warn) {
    TORCH_WARN("torch_tern: operator '", name,
               "' has no native tern kernel; running it on the CPU");
  }
  at::native::cpu_fallback(op, stack);
}

std::map<std::string, int64_t> FallbackOps() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::map<std::string, int64_t>(g_counts->begin(), g_counts->end());
}

void ClearFallbackOps() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_counts->clear();
  g_warned->clear();
}

}  // namespace torch_tern
