// Native compute kernels: single-op tern executables, built with the builder
// API (include/tern/builder.h), cached by key and run with
// tern_queue_execute() on the current stream's queue.
//
// How an operator plugs in (see README.md, "Adding a native kernel"):
//
//   at::Tensor& TernAdd(...) {
//     if (kernels::LaunchSingleOp("aten::add.out", TERN_OP_BINARY, {out}, {a, b},
//                                 /*ints=*/{TERN_BINARY_ADD}, /*floats=*/{}))
//       return out;
//     return <fallback>;            // e.g. the boxed CPU fallback
//   }
//
// Every tensor operand is bound through the range its elements span in its
// buffer (input/output i of the executable, declared as a 1-D tensor of that
// many elements), and the instruction addresses it with the tensor's own
// sizes and strides: non-contiguous and broadcast (stride 0) tensors need no
// copies. The key is (op, opcode, device, each operand's dtype, sizes and
// strides, ints, floats), so one executable serves every call of that shape.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tern/builder.h"
#include "tern/executable.h"
#include "tern/isa.h"

namespace torch_tern::kernels {

// True when this libtern exports the builder and executable API and
// TORCH_TERN_KERNELS is not "0".
bool ExecutablesAvailable();

std::optional<tern_dtype_t> ToTernDtype(at::ScalarType type);

// Builds (first call for a key) and enqueues one instruction on the current
// stream of the operands' device. Returns false, having queued nothing, when
// the op cannot run natively (no executables, unsupported dtype or rank, or
// the builder/loader refused it: the reason is kept in CacheInfo()); callers
// then take their fallback path.
bool LaunchSingleOp(const std::string& op, tern_opcode_t opcode,
                    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                    const std::vector<int64_t>& ints, const std::vector<double>& floats);

// Device-to-device copy of any layout and dtype (TERN_OP_COPY / TERN_OP_CAST).
bool TryCopyKernel(const at::Tensor& src, const at::Tensor& dst);

struct CacheInfo {
  bool executables_available = false;
  int64_t entries = 0;  // executables loaded
  int64_t hits = 0;
  int64_t misses = 0;    // builds attempted
  int64_t failures = 0;  // builds or loads refused (cached: not retried)
  int64_t launches = 0;
  std::string last_error;
};
CacheInfo GetCacheInfo();
// Unloads every cached executable (waits for the device first).
void ClearCache();

}  // namespace torch_tern::kernels
