// Moving bytes: host<->device and device<->device copies, fills and storage
// resizing, all as tern queue commands on the current stream's queue.
//
// Layouts: a copy between two tensors of one dtype whose elements sit at the
// same strides in a dense range ("dense twins") is one DMA of that range. Any
// other layout or a dtype change is converted on the host for now (read the
// source range, let the CPU copy_ rearrange/convert, write the destination
// range); once executables are available, device-to-device rearrangement and
// casts run as TERN_OP_COPY / TERN_OP_CAST kernels (program.h).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "aten/minimal.h"
#include "aten/program.h"
#include "runtime/capture.h"
#include "runtime/host_allocator.h"

namespace torch_tern {
namespace {

size_t SpanBytes(const at::Tensor& t) {
  return static_cast<size_t>(SpanElements(t)) * t.element_size();
}

bool IsDense(const at::Tensor& t) { return t.is_non_overlapping_and_dense(); }

// Same dtype, sizes and strides, and no gaps: the byte ranges correspond 1:1.
bool DenseTwins(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && IsDense(a) && !a.is_conj() && !b.is_conj() && !a.is_neg() &&
         !b.is_neg();
}

// Keeps a host storage alive until the queue reaches the callback.
void ReleaseStorage(void* user_data, tern_status_t) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(user_data));
}

constexpr const char* kD2H =
    "a device-to-host copy (.cpu(), .item(), .tolist(), printing a tern tensor, or an operator "
    "that reads device values on the host)";

// Host bytes that a capture records by value (its replays write what the
// host tensor held at capture time): up to this size, larger copies are
// refused, since a replay would not read the host tensor again.
constexpr size_t kMaxCapturedHostBytes = 64 * 1024;

bool IsTernPinned(const at::Tensor& t) {
  return t.is_cpu() && TernHostAllocator::Get().IsPinned(t.data_ptr());
}

// Reads the span of `src` (on tern) into a new CPU tensor with src's sizes
// and strides, and waits for it.
at::Tensor ReadToHost(const at::Tensor& src) {
  const int64_t span = SpanElements(src);
  at::Tensor buffer = at::empty({span}, src.options().device(at::kCPU));
  if (span > 0) {
    const DeviceLocation loc = Locate(src);
    tern_queue_t queue = CurrentQueue(src.device().index());
    RefuseIfCapturing(queue, kD2H);
    uint64_t sequence = 0;
    TERN_CHECK(tern_queue_copy_d2h(queue, buffer.data_ptr(), loc.buffer, loc.offset, SpanBytes(src),
                                   &sequence));
    WaitQueue(queue, sequence);
  }
  return buffer.as_strided(src.sizes(), src.strides(), 0);
}

// Writes host tensor `host` (a dense twin of `dst`) into dst's span.
void WriteFromHost(const at::Tensor& host, const at::Tensor& dst, bool non_blocking) {
  const size_t bytes = SpanBytes(dst);
  if (bytes == 0) return;
  const DeviceLocation loc = Locate(dst);
  tern_queue_t queue = CurrentQueue(dst.device().index());
  if (C10_UNLIKELY(IsCapturing(queue))) {
    if (bytes > kMaxCapturedHostBytes) {
      RefuseIfCapturing(queue, "a host-to-device copy of " + std::to_string(bytes) +
                                   " bytes (over " + std::to_string(kMaxCapturedHostBytes) +
                                   ", the most a graph records by value; copy into a static tern "
                                   "tensor before capturing)");
    }
    const auto* data = static_cast<const uint8_t*>(host.data_ptr());
    SubmitOwnedH2D(queue, loc.buffer, loc.offset, std::vector<uint8_t>(data, data + bytes));
    return;
  }
  uint64_t sequence = 0;
  TERN_CHECK(tern_queue_copy_h2d(queue, loc.buffer, loc.offset, host.data_ptr(), bytes, &sequence));
  if (non_blocking && IsTernPinned(host)) {
    // Asynchronous as on CUDA: the pinned block is not reused (record_event)
    // and its storage stays alive until the copy has run.
    const c10::Storage& storage = host.storage();
    TernHostAllocator::Get().record_event(const_cast<void*>(storage.data()),
                                          storage.data_ptr().get_context(),
                                          GetCurrentStream(dst.device().index()));
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    c10::raw::intrusive_ptr::incref(impl);
    const tern_status_t status = tern_queue_host_callback(queue, &ReleaseStorage, impl, nullptr);
    if (status == TERN_OK) return;
    c10::raw::intrusive_ptr::decref(impl);
  }
  WaitQueue(queue, sequence);
}

void CopyHostToDevice(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (IsDense(dst)) {
    if (DenseTwins(src, dst)) {
      WriteFromHost(src, dst, non_blocking);
      return;
    }
    at::Tensor host = at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(at::kCPU));
    host.copy_(src);
    WriteFromHost(host, dst, /*non_blocking=*/false);
    return;
  }
  // dst has gaps: read its range, update the elements, write the range back.
  at::Tensor host = ReadToHost(dst);
  host.copy_(src);
  const at::Tensor range = host.as_strided({SpanElements(dst)}, {1}, 0);
  const DeviceLocation loc = Locate(dst);
  tern_queue_t queue = CurrentQueue(dst.device().index());
  uint64_t sequence = 0;
  TERN_CHECK(tern_queue_copy_h2d(queue, loc.buffer, loc.offset, range.data_ptr(), SpanBytes(dst),
                                 &sequence));
  WaitQueue(queue, sequence);
}

void CopyDeviceToHost(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  if (DenseTwins(src, dst)) {
    const DeviceLocation loc = Locate(src);
    tern_queue_t queue = CurrentQueue(src.device().index());
    RefuseIfCapturing(queue, kD2H);
    uint64_t sequence = 0;
    TERN_CHECK(tern_queue_copy_d2h(queue, dst.data_ptr(), loc.buffer, loc.offset, SpanBytes(src),
                                   &sequence));
    // Non-blocking into pinned memory returns at once, as on CUDA: the user
    // synchronizes before reading.
    if (non_blocking && IsTernPinned(dst)) {
      const c10::Storage& storage = dst.storage();
      TernHostAllocator::Get().record_event(const_cast<void*>(storage.data()),
                                            storage.data_ptr().get_context(),
                                            GetCurrentStream(src.device().index()));
      return;
    }
    WaitQueue(queue, sequence);
    return;
  }
  dst.copy_(ReadToHost(src));
}

void CopyDeviceToDevice(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  const c10::DeviceIndex src_device = src.device().index();
  const c10::DeviceIndex dst_device = dst.device().index();
  if (DenseTwins(src, dst)) {
    tern_queue_t queue = CurrentQueue(dst_device);
    if (src_device != dst_device) {
      RefuseIfCapturing(queue, "a copy between two tern devices (an event across streams)");
      RefuseIfCapturing(CurrentQueue(src_device),
                        "a copy between two tern devices (an event across streams)");
      // Order after the work already queued on the source's stream, and keep
      // the source block from being reused before the copy ran.
      tern_event_t event = nullptr;
      TERN_CHECK(tern_event_create(&event));
      tern_status_t status = tern_queue_record_event(CurrentQueue(src_device), event, nullptr);
      if (status == TERN_OK) status = tern_queue_wait_event(queue, event, nullptr);
      tern_event_destroy(event);  // submitted waits keep working (event.h)
      TERN_CHECK(status);
      TernDeviceAllocator::Get().recordStream(src.storage().data_ptr(),
                                              GetCurrentStream(dst_device));
    }
    const DeviceLocation from = Locate(src);
    const DeviceLocation to = Locate(dst);
    SubmitCopyD2D(queue, to.buffer, to.offset, from.buffer, from.offset, SpanBytes(src));
    return;
  }
  if (src_device == dst_device && program::TryCopyKernel(src, dst)) return;
  at::Tensor host = ReadToHost(src);
  CopyHostToDevice(host, dst, false);
}

}  // namespace

int64_t SpanElements(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  return span;
}

DeviceLocation Locate(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "expected a tern tensor, got ",
              t.device());
  if (!t.has_storage()) return TernDeviceAllocator::Get().Resolve(t.data_ptr(), t.device().index());
  return TernDeviceAllocator::Get().Resolve(t.storage(), t.data_ptr(), t.device().index());
}

void EnqueueOwnedH2D(tern_queue_t queue, tern_buffer_t buffer, uint64_t offset,
                     std::vector<uint8_t> bytes) {
  SubmitOwnedH2D(queue, buffer, offset, std::move(bytes));
}

void Copy(const at::Tensor& src_in, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(src_in.defined() && dst.defined(), "copy_: undefined tensor");
  if (dst.numel() == 0) return;
  at::Tensor src = src_in.sizes() == dst.sizes() ? src_in : src_in.expand_as(dst);
  const bool src_tern = src.device().type() == c10::DeviceType::PrivateUse1;
  const bool dst_tern = dst.device().type() == c10::DeviceType::PrivateUse1;
  if (src_tern && (src.is_conj() || src.is_neg())) {
    // A lazily conjugated/negated tern tensor: read its stored elements,
    // apply the bits on the host, write the values (ops.cc registers
    // _copy_from as a fallthrough of the Conjugate/Negative keys, so it
    // arrives here with its bits).
    at::Tensor host = ReadToHost(src);
    if (src.is_conj()) host = host.conj();
    if (src.is_neg()) host = host._neg_view();
    host = host.resolve_conj().resolve_neg();
    if (dst_tern) {
      CopyHostToDevice(host, dst, false);
    } else {
      dst.copy_(host);
    }
    return;
  }
  if (src_tern && dst_tern) {
    CopyDeviceToDevice(src, dst, non_blocking);
  } else if (dst_tern) {
    TORCH_CHECK(src.is_cpu(), "copy_ to tern supports CPU and tern sources, got ", src.device());
    CopyHostToDevice(src.resolve_conj().resolve_neg(), dst, non_blocking);
  } else {
    TORCH_CHECK(src_tern && dst.is_cpu(), "copy_ from tern supports CPU destinations, got ",
                dst.device());
    CopyDeviceToHost(src, dst, non_blocking);
  }
}

namespace {

// One element of `value` as `dtype`, as bytes.
std::vector<uint8_t> ElementBytes(const c10::Scalar& value, at::ScalarType dtype) {
  at::Tensor element = at::scalar_tensor(value, at::TensorOptions().dtype(dtype));
  const auto* data = static_cast<const uint8_t*>(element.data_ptr());
  return std::vector<uint8_t>(data, data + element.element_size());
}

// A 32-bit word that repeats the element, if the element size allows it.
std::optional<uint32_t> FillPattern(const std::vector<uint8_t>& element) {
  const size_t size = element.size();
  if (size == 1 || size == 2 || size == 4) {
    uint8_t word[4];
    for (size_t i = 0; i < 4; ++i) word[i] = element[i % size];
    uint32_t pattern;
    std::memcpy(&pattern, word, 4);
    return pattern;
  }
  // 8 or 16 bytes: only when every 32-bit word is the same (0, -1, ...).
  if (size % 4 == 0) {
    for (size_t i = 4; i < size; ++i) {
      if (element[i] != element[i % 4]) return std::nullopt;
    }
    uint32_t pattern;
    std::memcpy(&pattern, element.data(), 4);
    return pattern;
  }
  return std::nullopt;
}

// Fills `count` elements at (buffer, offset) with `element`.
void FillRange(tern_queue_t queue, const DeviceLocation& loc, int64_t count,
               const std::vector<uint8_t>& element) {
  const size_t item = element.size();
  const uint64_t begin = loc.offset;
  const uint64_t end = begin + static_cast<uint64_t>(count) * item;
  if (auto pattern = FillPattern(element)) {
    // Unaligned head and tail (sub-4-byte elements only) go as small copies;
    // every byte lane of the pattern holds the right element byte because
    // the pattern repeats with the element's period.
    const uint64_t aligned_begin = std::min(end, (begin + 3) / 4 * 4);
    const uint64_t aligned_end = std::max(aligned_begin, end / 4 * 4);
    auto lane_bytes = [&](uint64_t from, uint64_t to) {
      std::vector<uint8_t> bytes(to - from);
      for (uint64_t i = from; i < to; ++i) bytes[i - from] = element[(i - begin) % item];
      return bytes;
    };
    if (aligned_begin > begin) {
      EnqueueOwnedH2D(queue, loc.buffer, begin, lane_bytes(begin, aligned_begin));
    }
    if (aligned_end > aligned_begin) {
      SubmitFill(queue, loc.buffer, aligned_begin, aligned_end - aligned_begin, *pattern);
    }
    if (end > aligned_end)
      EnqueueOwnedH2D(queue, loc.buffer, aligned_end, lane_bytes(aligned_end, end));
    return;
  }
  // Any other element: write one, then double the filled prefix with
  // device-to-device copies (log2(count) commands, in queue order).
  EnqueueOwnedH2D(queue, loc.buffer, begin, element);
  for (int64_t filled = 1; filled < count;) {
    const int64_t n = std::min(filled, count - filled);
    SubmitCopyD2D(queue, loc.buffer, begin + filled * item, loc.buffer, begin, n * item);
    filled += n;
  }
}

}  // namespace

at::Tensor& Fill(at::Tensor& self, const c10::Scalar& value) {
  if (self.numel() == 0) return self;
  if (!IsDense(self)) {
    // Gaps between the elements: fill a dense tensor, then copy it in.
    at::Tensor dense = at::empty(self.sizes(), self.options());
    Fill(dense, value);
    Copy(dense, self, false);
    return self;
  }
  const std::vector<uint8_t> element = ElementBytes(value, self.scalar_type());
  FillRange(CurrentQueue(self.device().index()), Locate(self), self.numel(), element);
  return self;
}

void ResizeStorageBytes(const c10::Storage& storage, size_t new_bytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const size_t old_bytes = storage.nbytes();
  if (new_bytes == old_bytes) return;
  c10::DeviceGuard guard(storage.device());
  at::DataPtr fresh = TernDeviceAllocator::Get().allocate(new_bytes);
  const size_t keep = std::min(old_bytes, new_bytes);
  if (keep > 0 && storage.data() != nullptr) {
    auto& allocator = TernDeviceAllocator::Get();
    const DeviceLocation from = allocator.Resolve(storage.data());
    const DeviceLocation to = allocator.Resolve(fresh.get());
    const c10::Stream stream = GetCurrentStream(storage.device().index());
    SubmitCopyD2D(GetQueue(stream), to.buffer, to.offset, from.buffer, from.offset, keep);
    // The old block may belong to another stream: keep it until the copy ran.
    allocator.recordStream(storage.data_ptr(), stream);
  }
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

}  // namespace torch_tern
