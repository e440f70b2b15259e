// Everything the plugin registers with the dispatcher in one place: the
// native operators' list (TERN_ATEN_IMPL beside each kernel, register.h) and
// the TORCH_LIBRARY_IMPL blocks of the other dispatch keys.
#include "aten/register.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <map>
#include <string_view>

#include "aten/fallback.h"

namespace torch_tern {
namespace native {
namespace {

struct Entry {
  c10::DispatchKey key;
  const char* name;
  torch::CppFunction kernel;  // moved into the dispatcher by RegisterNativeOps
  const char* file;
  int line;
};

// A function-local static: TERN_ATEN_IMPL runs during static initialisation,
// in whatever order the translation units come, and may be the first to ask.
std::vector<Entry>& Entries() {
  static std::vector<Entry> entries;
  return entries;
}

size_t RegisterEntries() {
  std::vector<Entry>& entries = Entries();
  std::map<std::pair<c10::DispatchKey, std::string_view>, const Entry*> seen;
  for (const Entry& e : entries) {
    const auto [it, added] = seen.emplace(std::make_pair(e.key, std::string_view(e.name)), &e);
    TORCH_CHECK(added, "torch_tern: two ", c10::toString(e.key), " kernels for aten::", e.name,
                ", at ", it->second->file, ":", it->second->line, " and ", e.file, ":", e.line);
  }
  // One library per dispatch key; destroying one would unregister its kernels.
  static std::map<c10::DispatchKey, torch::Library> libraries;
  for (Entry& e : entries) {
    auto it = libraries.find(e.key);
    if (it == libraries.end()) {
      it = libraries
               .emplace(e.key,
                        torch::Library(torch::Library::IMPL, "aten", e.key, __FILE__, __LINE__))
               .first;
    }
    it->second.impl(e.name, std::move(e.kernel));
  }
  return entries.size();
}

}  // namespace

OpRegistrar::OpRegistrar(c10::DispatchKey key, const char* name, torch::CppFunction kernel,
                         const char* file, int line) {
  Entries().push_back(Entry{key, name, std::move(kernel), file, line});
}

size_t RegisterNativeOps() {
  static const size_t count = RegisterEntries();
  return count;
}

std::vector<std::pair<std::string, std::string>> NativeOps() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Entry& e : Entries()) out.emplace_back(c10::toString(e.key), e.name);
  return out;
}

}  // namespace native

namespace {

// Every other operator: the logged CPU fallback (fallback.cc).
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
}

// Sparse tensors on tern (COO; CSR, CSC, BSR, BSC): every operator says why
// not and what to do (without it, PyTorch's "Could not run ... from the
// 'Sparsetern' backend"). The CPU fallback cannot take them: its copies back
// to tern are strided.
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&SparseRefusal>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&SparseRefusal>());
}

// _copy_from handles conjugate and negative bits itself (copy.cc). Without
// these fallthroughs the Conjugate/Negative fallbacks would materialize the
// source with clone(), whose copy_ calls _copy_from again, forever.
void RegisterCopyFallthroughs(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { RegisterCopyFallthroughs(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { RegisterCopyFallthroughs(m); }

// Autocast: the policy lists torch shares between backends, bound to the
// AutocastPrivateUse1 key. Ops in the lower-precision list run in the
// autocast dtype (bfloat16 by default on tern, see torch_tern/__init__.py),
// the fp32 list runs in float32, the promote list in the widest input type.
// The casts happen above the backend, so this holds for ops that take the
// CPU fallback too.
using at::Tensor;
using at::autocast::CastPolicy;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#define TERN_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TERN_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TERN_AUTOCAST_FP32_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TERN_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TERN_AUTOCAST_LOWER)
  AT_FORALL_FP32(TERN_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TERN_AUTOCAST_FP32_OPT_DTYPE)
  AT_FORALL_PROMOTE(TERN_AUTOCAST_PROMOTE)
}

}  // namespace
}  // namespace torch_tern
