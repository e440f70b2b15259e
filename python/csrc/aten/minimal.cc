// The operators every PrivateUse1 backend must provide (allocation, views,
// copies, resizing, set_, scalars) plus the native fills. Views only change
// metadata: they never touch device memory.
#include "aten/minimal.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/register.h"

namespace torch_tern {
namespace {

constexpr c10::DispatchKeySet kTernKeys(c10::DispatchKey::PrivateUse1);

c10::Device TargetDevice(std::optional<c10::Device> device_opt) {
  c10::Device device = c10::device_or_default(device_opt);
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "expected a tern device, got ",
              device);
  if (!device.has_index()) device = c10::Device(device.type(), CurrentDevice());
  return device;
}

void CheckOptions(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "tern tensors are strided only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "only CPU tensors can be pinned");
}

at::Tensor EmptyMemoryFormat(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                             std::optional<bool> pin_memory,
                             std::optional<c10::MemoryFormat> memory_format) {
  CheckOptions(layout, pin_memory);
  const c10::DeviceGuard guard(TargetDevice(device));
  return at::detail::empty_generic(size, &TernDeviceAllocator::Get(), kTernKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}
TERN_ATEN_IMPL("empty.memory_format", EmptyMemoryFormat);

at::Tensor EmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  CheckOptions(layout, pin_memory);
  const c10::DeviceGuard guard(TargetDevice(device));
  return at::detail::empty_strided_generic(size, stride, &TernDeviceAllocator::Get(), kTernKeys,
                                           c10::dtype_or_default(dtype));
}
TERN_ATEN_IMPL("empty_strided", EmptyStrided);

at::Tensor AsStrided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                     std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}
TERN_ATEN_IMPL("as_strided", AsStrided);

at::Tensor View(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}
TERN_ATEN_IMPL("view", View);

at::Tensor ReshapeAlias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}
TERN_ATEN_IMPL("_reshape_alias", ReshapeAlias);

at::Tensor Unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}
TERN_ATEN_IMPL("unfold", Unfold);

at::Tensor ViewAsReal(const at::Tensor& self) { return at::native::view_as_real(self); }
TERN_ATEN_IMPL("view_as_real", ViewAsReal);
at::Tensor ViewAsComplex(const at::Tensor& self) { return at::native::view_as_complex(self); }
TERN_ATEN_IMPL("view_as_complex", ViewAsComplex);

const at::Tensor& Resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) impl->set_sizes_contiguous(size);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "unsupported memory format for resize_: Preserve");
    impl->empty_tensor_restride(*memory_format);
  }
  if (self.numel() > 0) {
    const size_t needed = at::detail::computeStorageNbytes(
        self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
    if (needed > self.storage().nbytes()) ResizeStorageBytes(self.storage(), needed);
  }
  return self;
}
TERN_ATEN_IMPL("resize_", Resize);

at::Tensor CopyFrom(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  Copy(self, dst, non_blocking);
  return dst;
}
TERN_ATEN_IMPL("_copy_from", CopyFrom);

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  Resize(dst, self.sizes(), std::nullopt);
  Copy(self, dst, false);
  return dst;
}
TERN_ATEN_IMPL("_copy_from_and_resize", CopyFromAndResize);

at::Scalar LocalScalarDense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(at::kCPU));
  Copy(self.reshape({}), host, false);
  return host.item();
}
TERN_ATEN_IMPL("_local_scalar_dense", LocalScalarDense);

at::Tensor& SetStorageOffset(at::Tensor& self, at::Storage storage, int64_t storage_offset,
                             c10::IntArrayRef size, c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, storage, storage_offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(storage_offset);
  if (stride.data() != nullptr) {
    impl->set_sizes_and_strides(size, stride);
  } else {
    impl->set_sizes_contiguous(size);
  }
  if (self.numel() > 0) {
    const size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(),
                                                           self.dtype().itemsize(), storage_offset);
    if (needed > self.storage().nbytes()) ResizeStorageBytes(self.storage(), needed);
  }
  return self;
}
TERN_ATEN_IMPL("set_.source_Storage_storage_offset", SetStorageOffset);

at::Tensor& SetStorage(at::Tensor& self, at::Storage storage) {
  const int64_t elements = static_cast<int64_t>(storage.nbytes() / self.dtype().itemsize());
  return SetStorageOffset(self, std::move(storage), 0, {elements}, {1});
}
TERN_ATEN_IMPL("set_.source_Storage", SetStorage);

at::Tensor& SetTensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return SetStorageOffset(self, source.storage(), source.storage_offset(), source.sizes(),
                          source.strides());
}
TERN_ATEN_IMPL("set_.source_Tensor", SetTensor);

at::Tensor& SetEmpty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &TernDeviceAllocator::Get(),
                       /*resizable=*/true);
  return SetStorageOffset(self, storage, 0, {0}, {});
}
TERN_ATEN_IMPL("set_", SetEmpty);

at::Tensor& FillScalar(at::Tensor& self, const at::Scalar& value) { return Fill(self, value); }
TERN_ATEN_IMPL("fill_.Scalar", FillScalar);

at::Tensor& FillTensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ",
              value.dim(), " dimensions.");
  return Fill(self, value.item());
}
TERN_ATEN_IMPL("fill_.Tensor", FillTensor);

at::Tensor& Zero(at::Tensor& self) { return Fill(self, 0); }
TERN_ATEN_IMPL("zero_", Zero);

// Whether `self` can take `from`'s data in place (set_data: `param.data = t`,
// which Module.to() uses to move parameters when it can). c10's own rule
// knows the CPU, CUDA, MPS and a few more, not PrivateUse1, so moving a CPU
// module to tern made new Parameter objects: an optimizer built before
// `.to("tern")` kept updating the old CPU ones, and attributes set on a
// parameter (DDP's `_ddp_ignored`) were lost, where CUDA keeps both. tern
// tensors are plain strided TensorImpls, as the CPU's are.
bool HasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  auto plain = [](const at::Tensor& t) {
    const c10::DeviceType type = t.device().type();
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (type == c10::DeviceType::CPU || type == c10::DeviceType::PrivateUse1);
  };
  if (plain(self) && plain(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}
TERN_ATEN_IMPL("_has_compatible_shallow_copy_type", HasCompatibleShallowCopyType);

// Tensor.record_stream(s): the block is not reused before work queued on `s`
// so far has run (see runtime/allocator.h).
void RecordStream(at::Tensor& self, c10::Stream stream) {
  TernDeviceAllocator::Get().recordStream(self.storage().data_ptr(), stream);
}
TERN_ATEN_IMPL("record_stream", RecordStream);

}  // namespace
}  // namespace torch_tern
