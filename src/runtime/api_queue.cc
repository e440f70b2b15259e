// Queues: creation, command submission, synchronization, sticky errors.
#include <cstring>

#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"

namespace tern {
namespace {

Status GetQueue(tern_queue_t queue, Runtime** rt, QueueObject** out) {
  TERN_RETURN_IF_ERROR(GetRuntime(rt));
  return PeekQueue(*rt, queue, "queue", out);
}

Status Submit(QueueObject& queue, driver::Command command, uint64_t* out_sequence) {
  uint64_t sequence = 0;
  TERN_RETURN_IF_ERROR(queue.hw->Submit(std::move(command), &sequence));
  if (out_sequence != nullptr) *out_sequence = sequence;
  return OkStatus();
}

// A device buffer range as a copy endpoint, checked against the queue's device.
Status DeviceRef(Runtime* rt, const QueueObject& queue, tern_buffer_t buffer, uint64_t offset,
                 uint64_t size, const char* arg, bool must_be_local, driver::MemoryRef* out) {
  return ResolveDeviceRange(rt, buffer, offset, size, arg,
                            must_be_local ? queue.core->device : nullptr, "the queue runs on",
                            "submit to a queue", out);
}

Status CopyH2D(Runtime* rt, QueueObject& queue, tern_buffer_t dst, uint64_t dst_offset,
               const void* src, uint64_t size, uint64_t* out_sequence) {
  if (src == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "src is NULL");
  driver::Command command;
  command.kind = driver::CommandKind::kCopy;
  command.size = size;
  TERN_RETURN_IF_ERROR(DeviceRef(rt, queue, dst, dst_offset, size, "dst", true, &command.dst));
  command.src.host = const_cast<void*>(src);
  return Submit(queue, std::move(command), out_sequence);
}

Status CopyD2H(Runtime* rt, QueueObject& queue, void* dst, tern_buffer_t src, uint64_t src_offset,
               uint64_t size, uint64_t* out_sequence) {
  if (dst == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "dst is NULL");
  driver::Command command;
  command.kind = driver::CommandKind::kCopy;
  command.size = size;
  TERN_RETURN_IF_ERROR(DeviceRef(rt, queue, src, src_offset, size, "src", true, &command.src));
  command.dst.host = dst;
  return Submit(queue, std::move(command), out_sequence);
}

Status CopyD2D(Runtime* rt, QueueObject& queue, tern_buffer_t dst, uint64_t dst_offset,
               tern_buffer_t src, uint64_t src_offset, uint64_t size, uint64_t* out_sequence) {
  driver::Command command;
  command.kind = driver::CommandKind::kCopy;
  command.size = size;
  TERN_RETURN_IF_ERROR(DeviceRef(rt, queue, dst, dst_offset, size, "dst", false, &command.dst));
  TERN_RETURN_IF_ERROR(DeviceRef(rt, queue, src, src_offset, size, "src", false, &command.src));
  if (command.dst.device != queue.core->device->hw.get() &&
      command.src.device != queue.core->device->hw.get()) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "neither dst nor src lives on the queue's device {}; submit the copy to a "
                      "queue of one of their devices",
                      queue.core->device->index);
  }
  return Submit(queue, std::move(command), out_sequence);
}

Status Fill(Runtime* rt, QueueObject& queue, tern_buffer_t dst, uint64_t dst_offset, uint64_t size,
            uint32_t pattern, uint64_t* out_sequence) {
  if (dst_offset % 4 != 0 || size % 4 != 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fill offset {} and size {} must be multiples of 4 (the pattern is 32-bit)",
                      dst_offset, size);
  }
  driver::Command command;
  command.kind = driver::CommandKind::kFill;
  command.size = size;
  command.pattern = pattern;
  TERN_RETURN_IF_ERROR(DeviceRef(rt, queue, dst, dst_offset, size, "dst", true, &command.dst));
  return Submit(queue, std::move(command), out_sequence);
}

Status WaitEvent(Runtime* rt, QueueObject& queue, tern_event_t event, uint64_t* out_sequence) {
  std::shared_ptr<EventObject> object;
  TERN_RETURN_IF_ERROR(LookupEvent(rt, event, "event", &object));
  return Submit(queue, MakeEventWaitCommand(*object), out_sequence);
}

Status RecordEvent(Runtime* rt, QueueObject& queue, tern_event_t event, uint64_t* out_sequence) {
  std::shared_ptr<EventObject> object;
  TERN_RETURN_IF_ERROR(LookupEvent(rt, event, "event", &object));
  auto point = std::make_shared<EventPoint>();
  point->timeline = queue.hw->completion();
  driver::Command command;
  command.kind = driver::CommandKind::kTimestamp;
  command.timestamp_out = &point->timestamp_ns;
  command.keep_alive = point;
  // Recording holds the event's lock across submission, so that concurrent
  // records of one event publish in submission order.
  std::lock_guard<std::mutex> lock(object->mutex);
  uint64_t sequence = 0;
  TERN_RETURN_IF_ERROR(queue.hw->Submit(std::move(command), &sequence));
  point->sequence = sequence;
  point->queue_name = queue.shared_name;
  object->point = std::move(point);
  if (out_sequence != nullptr) *out_sequence = sequence;
  return OkStatus();
}

Status WaitFor(const QueueObject& queue, uint64_t target, uint64_t timeout_ns) {
  const Timeline* completion = queue.completion;
  // A waiter without a deadline may run the commands it waits for itself
  // when the queue's engine is not at them (driver::HwQueue::RunUntil); one
  // with a deadline is not kept past it by a long command.
  if (timeout_ns == TERN_TIMEOUT_INFINITE) queue.hw->RunUntil(target);
  if (!completion->Wait(target, timeout_ns)) {
    return MakeStatus(TERN_ERROR_TIMEOUT,
                      "queue '{}' did not reach command {} within {} ns ({} of {} commands done); "
                      "wait longer, or look for a command that waits on an event never reached",
                      queue.name, target, timeout_ns, completion->value(), queue.hw->submitted());
  }
  return OkStatus();
}

// The body of the entry points that submit one command: clears
// *out_sequence, resolves the queue, and reports what `submit(rt, queue)`
// returns.
template <typename SubmitFn>
tern_status_t SubmitTo(tern_queue_t queue, uint64_t* out_sequence, SubmitFn&& submit) {
  if (out_sequence != nullptr) *out_sequence = 0;
  Runtime* rt;
  QueueObject* q;
  TERN_API_TRY(GetQueue(queue, &rt, &q));
  return Report(submit(rt, *q));
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_queue_create(tern_core_t core, const tern_queue_params_t* params,
                                         tern_queue_t* out_queue) {
  TERN_API_CLEAR_OUT(out_queue, nullptr);
  Runtime* rt;
  std::shared_ptr<CoreObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupCore(rt, core, "core", &object));
  std::string name;
  if (params != nullptr) {
    TERN_API_TRY(
        CheckStructSize(params->struct_size, sizeof(tern_queue_params_t), "tern_queue_params_t"));
    TERN_API_TRY(CheckNoFlags(params->flags, "tern_queue_params_t"));
    if (params->name != nullptr) name = params->name;
  }
  auto queue = std::make_shared<QueueObject>();
  queue->core = object;
  const uint32_t number = object->queue_count.fetch_add(1);
  if (name.empty()) name = fmt::format("d{}c{}q{}", object->device->index, object->index, number);
  queue->name = name;
  queue->shared_name = std::make_shared<const std::string>(name);
  Status status = object->device->hw->CreateQueue(object->physical, name, &queue->hw);
  if (!status.ok()) {
    object->queue_count.fetch_sub(1);
    return Report(status);
  }
  queue->completion = queue->hw->completion().get();
  DeviceObject* device = object->device;
  {
    std::lock_guard<std::mutex> lock(device->queues_mutex);
    // Drop the entries of destroyed queues while here.
    std::erase_if(device->queues, [](const std::weak_ptr<QueueObject>& q) { return q.expired(); });
    device->queues.push_back(queue);
  }
  *out_queue = reinterpret_cast<tern_queue_t>(rt->queue_table.Insert(std::move(queue)));
  return TERN_OK;
}

TERN_API tern_status_t tern_queue_destroy(tern_queue_t queue) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<QueueObject> object = rt->queue_table.Remove(reinterpret_cast<uint64_t>(queue));
  if (!object) {
    return Report(NotALiveHandleToDestroy("queue", "queue", "already destroyed", "never created"));
  }
  {
    // Out of the device's list before the hardware queue goes (WaitForDeviceQueues).
    DeviceObject* device = object->core->device;
    std::lock_guard<std::mutex> lock(device->queues_mutex);
    std::erase_if(device->queues, [&](const std::weak_ptr<QueueObject>& q) {
      return q.expired() || q.lock() == object;
    });
  }
  std::shared_ptr<const Timeline> completion = object->hw->completion();
  CloseQueue(*object);
  return Report(completion->CurrentFailure(nullptr));
}

TERN_API tern_status_t tern_queue_nop(tern_queue_t queue, uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime*, QueueObject& q) {
    return Submit(q, driver::Command{}, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_copy_h2d(tern_queue_t queue, tern_buffer_t dst,
                                           uint64_t dst_offset, const void* src, uint64_t size,
                                           uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime* rt, QueueObject& q) {
    return CopyH2D(rt, q, dst, dst_offset, src, size, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_copy_d2h(tern_queue_t queue, void* dst, tern_buffer_t src,
                                           uint64_t src_offset, uint64_t size,
                                           uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime* rt, QueueObject& q) {
    return CopyD2H(rt, q, dst, src, src_offset, size, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_copy_d2d(tern_queue_t queue, tern_buffer_t dst,
                                           uint64_t dst_offset, tern_buffer_t src,
                                           uint64_t src_offset, uint64_t size,
                                           uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime* rt, QueueObject& q) {
    return CopyD2D(rt, q, dst, dst_offset, src, src_offset, size, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_fill(tern_queue_t queue, tern_buffer_t dst, uint64_t dst_offset,
                                       uint64_t size, uint32_t pattern, uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime* rt, QueueObject& q) {
    return Fill(rt, q, dst, dst_offset, size, pattern, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_host_callback(tern_queue_t queue, tern_host_callback_fn callback,
                                                void* user_data, uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime*, QueueObject& q) {
    if (callback == nullptr) return NullArgument("callback");
    driver::Command command;
    command.kind = driver::CommandKind::kHostFunction;
    command.host_function = callback;
    command.host_user_data = user_data;
    return Submit(q, std::move(command), out_sequence);
  });
}

TERN_API tern_status_t tern_queue_record_event(tern_queue_t queue, tern_event_t event,
                                               uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime* rt, QueueObject& q) {
    return RecordEvent(rt, q, event, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_wait_event(tern_queue_t queue, tern_event_t event,
                                             uint64_t* out_sequence) {
  return SubmitTo(queue, out_sequence, [&](Runtime* rt, QueueObject& q) {
    return WaitEvent(rt, q, event, out_sequence);
  });
}

TERN_API tern_status_t tern_queue_synchronize(tern_queue_t queue, uint64_t timeout_ns) {
  Runtime* rt;
  QueueObject* q;
  TERN_API_TRY(GetQueue(queue, &rt, &q));
  TERN_API_TRY(WaitFor(*q, q->hw->submitted(), timeout_ns));
  return Report(q->completion->CurrentFailure(nullptr));
}

TERN_API tern_status_t tern_queue_wait_sequence(tern_queue_t queue, uint64_t sequence,
                                                uint64_t timeout_ns) {
  Runtime* rt;
  QueueObject* q;
  TERN_API_TRY(GetQueue(queue, &rt, &q));
  if (sequence == 0 || sequence > q->hw->submitted()) {
    return Report(MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                             "sequence {} was never submitted to queue '{}' (it has {} commands; "
                             "sequence numbers start at 1)",
                             sequence, q->name, q->hw->submitted()));
  }
  TERN_API_TRY(WaitFor(*q, sequence, timeout_ns));
  return Report(q->completion->FailureAt(sequence));
}

TERN_API tern_status_t tern_queue_query(tern_queue_t queue, uint64_t* out_completed) {
  if (out_completed) *out_completed = 0;
  Runtime* rt;
  QueueObject* q;
  TERN_API_TRY(GetQueue(queue, &rt, &q));
  const uint64_t submitted = q->hw->submitted();
  const uint64_t completed = q->completion->value();
  if (out_completed) *out_completed = completed;
  TERN_API_TRY(q->completion->CurrentFailure(nullptr));
  if (completed >= submitted) return TERN_OK;
  // A caller that polls for the work wants it started (the engine may nap).
  q->completion->WakeProducer();
  // NOT_READY is an answer, not a failure: it leaves the last error alone.
  return TERN_ERROR_NOT_READY;
}

TERN_API tern_status_t tern_queue_last_submitted(tern_queue_t queue, uint64_t* out_sequence) {
  TERN_API_CLEAR_OUT(out_sequence, 0);
  Runtime* rt;
  QueueObject* q;
  TERN_API_TRY(GetQueue(queue, &rt, &q));
  *out_sequence = q->hw->submitted();
  return TERN_OK;
}

TERN_API tern_status_t tern_queue_clear_error(tern_queue_t queue) {
  Runtime* rt;
  QueueObject* q;
  TERN_API_TRY(GetQueue(queue, &rt, &q));
  Status cleared = q->completion->CurrentFailure(nullptr);
  q->hw->ClearError();
  return Report(cleared);
}

}  // extern "C"
