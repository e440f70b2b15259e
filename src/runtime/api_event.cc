// Events: points on queue timelines.
#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"

namespace tern {
namespace {

Status GetPoint(tern_event_t event, std::shared_ptr<EventPoint>* out) {
  Runtime* rt;
  TERN_RETURN_IF_ERROR(GetRuntime(&rt));
  std::shared_ptr<EventObject> object;
  TERN_RETURN_IF_ERROR(LookupEvent(rt, event, "event", &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  *out = object->point;
  return OkStatus();
}

// OK when complete, NOT_READY when pending, the queue's failure otherwise.
Status PointState(const EventPoint& point) {
  if (point.timeline->value() < point.sequence) {
    // A caller that polls for the event wants the work started (its queue's
    // engine may nap).
    point.timeline->WakeProducer();
    return Status(TERN_ERROR_NOT_READY, "the event has not completed yet");
  }
  Status failure = point.timeline->FailureAt(point.sequence);
  if (!failure.ok()) {
    return Status(failure.code(),
                  fmt::format("{} did not complete: {}", point.Description(), failure.message()));
  }
  return OkStatus();
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_event_create(tern_event_t* out_event) {
  TERN_API_CLEAR_OUT(out_event, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  const uint64_t handle = rt->event_table.Insert(std::make_shared<EventObject>());
  if (handle == 0) return Report(HandleTableFull("events"));
  *out_event = reinterpret_cast<tern_event_t>(handle);
  return TERN_OK;
}

TERN_API tern_status_t tern_event_destroy(tern_event_t event) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  if (!rt->event_table.Remove(reinterpret_cast<uint64_t>(event))) {
    return Report(NotALiveHandleToDestroy("event", "event", "already destroyed", "never created"));
  }
  return TERN_OK;
}

TERN_API tern_status_t tern_event_query(tern_event_t event) {
  std::shared_ptr<EventPoint> point;
  TERN_API_TRY(GetPoint(event, &point));
  if (!point) return TERN_OK;
  const Status status = PointState(*point);
  // NOT_READY is an answer, not a failure: it leaves the last error alone.
  if (status.code() == TERN_ERROR_NOT_READY) return TERN_ERROR_NOT_READY;
  return Report(status);
}

TERN_API tern_status_t tern_event_synchronize(tern_event_t event, uint64_t timeout_ns) {
  std::shared_ptr<EventPoint> point;
  TERN_API_TRY(GetPoint(event, &point));
  if (!point) return TERN_OK;
  if (!point->timeline->Wait(point->sequence, timeout_ns)) {
    return Report(MakeStatus(TERN_ERROR_TIMEOUT, "{} did not complete within {} ns",
                             point->Description(), timeout_ns));
  }
  return Report(PointState(*point));
}

TERN_API tern_status_t tern_event_elapsed_ns(tern_event_t start, tern_event_t end,
                                             uint64_t* out_ns) {
  TERN_API_CLEAR_OUT(out_ns, 0);
  std::shared_ptr<EventPoint> first, second;
  TERN_API_TRY(GetPoint(start, &first));
  TERN_API_TRY(GetPoint(end, &second));
  if (!first || !second) {
    return Report(MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                             "the {} event was never recorded: record both with "
                             "tern_queue_record_event() first",
                             !first ? "start" : "end"));
  }
  Status status = PointState(*first);
  if (status.ok()) status = PointState(*second);
  if (status.code() == TERN_ERROR_NOT_READY) return TERN_ERROR_NOT_READY;
  if (!status.ok()) return Report(status);
  const uint64_t a = first->timestamp_ns.load(std::memory_order_acquire);
  const uint64_t b = second->timestamp_ns.load(std::memory_order_acquire);
  *out_ns = b >= a ? b - a : 0;
  return TERN_OK;
}

}  // extern "C"
