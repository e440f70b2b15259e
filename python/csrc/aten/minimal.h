// Native ATen operators of the tern backend, and the memory helpers that
// operators and kernels share.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/runtime.h"

namespace torch_tern {

// Elements between a tensor's lowest and highest element, inclusive (torch
// strides are never negative, so the lowest one is at data_ptr()).
int64_t SpanElements(const at::Tensor& t);
// The tern buffer and offset holding `t`'s first element (its data_ptr()).
DeviceLocation Locate(const at::Tensor& t);

// Copies `bytes` host bytes into a device range on `queue` and frees them
// once the copy ran (a host callback owns them until then).
void EnqueueOwnedH2D(tern_queue_t queue, tern_buffer_t buffer, uint64_t offset,
                     std::vector<uint8_t> bytes);

// Copies between any two tensors of which at least one is on tern
// (broadcasting `src`, converting dtypes): the body of aten::_copy_from.
void Copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

// Fills `self` (on tern) with `value` using tern's queue fill and copies.
at::Tensor& Fill(at::Tensor& self, const c10::Scalar& value);

// Grows or shrinks a tern storage to `new_bytes`, keeping its contents.
void ResizeStorageBytes(const c10::Storage& storage, size_t new_bytes);

}  // namespace torch_tern
