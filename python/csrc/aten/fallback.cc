// Every operator reaching the PrivateUse1 key without a tern kernel lands in
// this boxed fallback: it is counted under its full name, then runs on the
// CPU (at::native::cpu_fallback moves the arguments to the CPU and the
// results back, through the plugin's own copies).
//
// TORCH_TERN_FALLBACK (read on every fallback, so tests can flip it):
//   unset / "allow"  run on the CPU silently (default)
//   "warn"           also warn, once per operator
//   "error"          raise instead, naming the operator
//
// An argument the operator writes (out=, or self of an in-place op) must be
// a tern tensor when another argument is: CUDA raises the same-device error
// there, and cpu_fallback would compute on the CPU and then fail to copy the
// result back ("Could not run 'aten::_copy_from_and_resize' with arguments
// from the 'CPU' backend"). PyTorch's own tests expect the former
// (test_shape_ops.py test_nonzero: "on the same device").
#include "aten/fallback.h"

#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "runtime/capture.h"

namespace torch_tern {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, int64_t>* g_counts = new std::unordered_map<std::string, int64_t>();
std::unordered_set<std::string>* g_warned = new std::unordered_set<std::string>();

std::string OperatorName(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// The last n values of the stack: an operator's arguments before it runs,
// its results after. Fewer when the stack is shorter.
c10::ArrayRef<c10::IValue> LastValues(const torch::jit::Stack& stack, size_t n) {
  const size_t count = std::min(n, stack.size());
  return c10::ArrayRef<c10::IValue>(stack.data() + (stack.size() - count), count);
}

// The layout of the first defined tensor among values (alone or in a list)
// that is not strided.
std::optional<c10::Layout> FirstNonStridedLayout(c10::ArrayRef<c10::IValue> values) {
  auto non_strided = [](const at::Tensor& t) { return t.defined() && t.layout() != c10::kStrided; };
  for (const c10::IValue& value : values) {
    if (value.isTensor()) {
      if (non_strided(value.toTensor())) return value.toTensor().layout();
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) {
        if (non_strided(t)) return t.layout();
      }
    }
  }
  return std::nullopt;
}

void CheckWrittenArgumentsOnTern(const c10::OperatorHandle& op, const std::string& name,
                                 const torch::jit::Stack& stack) {
  const std::vector<c10::Argument>& args = op.schema().arguments();
  const size_t n = args.size();
  if (stack.size() < n) return;
  const c10::IValue* first = LastValues(stack, n).data();
  std::optional<c10::Device> tern;
  for (size_t i = 0; i < n && !tern; ++i) {
    if (first[i].isTensor() && first[i].toTensor().defined() &&
        first[i].toTensor().device().type() == c10::DeviceType::PrivateUse1) {
      tern = first[i].toTensor().device();
    }
  }
  if (!tern) return;
  for (size_t i = 0; i < n; ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    auto check = [&](const at::Tensor& t) {
      TORCH_CHECK(!t.defined() || t.device().type() == c10::DeviceType::PrivateUse1,
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, ",
                  *tern, " and ", t.device(), "! (when checking argument '", args[i].name(),
                  "' of ", name, ")");
    };
    if (first[i].isTensor()) {
      check(first[i].toTensor());
    } else if (first[i].isTensorList()) {
      for (const at::Tensor& t : first[i].toTensorVector()) check(t);
    }
  }
}

const char* LayoutName(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse:
      return "sparse COO";
    case c10::kSparseCsr:
      return "sparse CSR";
    case c10::kSparseCsc:
      return "sparse CSC";
    case c10::kSparseBsr:
      return "sparse BSR";
    case c10::kSparseBsc:
      return "sparse BSC";
    default:
      return "non-strided";
  }
}

[[noreturn]] void RefuseSparse(const std::string& name, c10::Layout layout) {
  C10_THROW_ERROR(
      NotImplementedError,
      c10::str("torch_tern: operator '", name, "' would make or use a ", LayoutName(layout),
               " tensor on tern, but tern tensors are strided (dense) only. Keep sparse tensors "
               "on the CPU, or make them dense (.to_dense()) before moving them to tern; for "
               "nn.Embedding / nn.EmbeddingBag on tern, use sparse=False (dense gradients)."));
}

}  // namespace

void SparseRefusal(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // The first sparse tensor argument (or a list's) names the layout; a
  // factory names it in its `layout` argument.
  const std::vector<c10::Argument>& args = op.schema().arguments();
  const c10::ArrayRef<c10::IValue> values = LastValues(*stack, args.size());
  std::optional<c10::Layout> layout = FirstNonStridedLayout(values);
  for (size_t i = 0; !layout && values.size() == args.size() && i < values.size(); ++i) {
    if (args[i].name() == "layout" && values[i].isInt() &&
        static_cast<c10::Layout>(values[i].toInt()) != c10::kStrided) {
      layout = static_cast<c10::Layout>(values[i].toInt());
    }
  }
  RefuseSparse(OperatorName(op), layout.value_or(c10::kSparse));
}

namespace {

// A sparse CSR, CSC, BSR or BSC result of the CPU fallback (to_sparse_csr) is
// made on tern from its strided parts without passing the sparse key, so the
// fallback refuses it here, before anything can use it.
void RefuseSparseResults(const c10::OperatorHandle& op, const std::string& name,
                         const torch::jit::Stack& stack) {
  const std::optional<c10::Layout> layout =
      FirstNonStridedLayout(LastValues(stack, op.schema().returns().size()));
  if (layout) RefuseSparse(name, *layout);
}

}  // namespace

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = OperatorName(op);
  RefuseIfCurrentStreamCapturing("operator '" + name +
                                 "' (it has no native tern kernel and would run on the CPU "
                                 "fallback, copying its tern tensors to the host and back)");
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
  CheckWrittenArgumentsOnTern(op, name, *stack);
  try {
    at::native::cpu_fallback(op, stack);
    RefuseSparseResults(op, name, *stack);
  } catch (const c10::NotImplementedError& e) {
    // PyTorch's own message names the CPU backend, as if the tensors were the
    // CPU's: say what happened to the tern tensors instead. Only for this
    // operator; a missing kernel deeper down keeps its message.
    const std::string missing = "Could not run '" + name + "' with arguments from the 'CPU'";
    if (std::string(e.what()).find(missing) == std::string::npos) throw;
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, "torch_tern: operator '", name,
        "' has no tern kernel, and PyTorch has no CPU kernel for it, so the CPU fallback "
        "cannot run it either (PyTorch implements it for some accelerators only). Avoid the "
        "call on tern tensors, or ask for a tern kernel naming this operator and the model "
        "that needs it.");
  }
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
