#include "local_channel.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "comm_kernels.h"

namespace tern::comm {

std::shared_ptr<LocalGroup> LocalGroup::Get(uint64_t nonce, uint32_t size) {
  static std::mutex mutex;
  static std::map<uint64_t, std::weak_ptr<LocalGroup>> groups;
  std::lock_guard<std::mutex> lock(mutex);
  std::erase_if(groups, [](const auto& entry) { return entry.second.expired(); });
  if (auto existing = groups[nonce].lock()) return existing;
  auto group = std::make_shared<LocalGroup>(size);
  groups[nonce] = group;
  return group;
}

void LocalChannel::Transfer(Request* send, Request* recv) {
  if (send->bytes != recv->bytes) {
    Status mismatch =
        MakeStatus(TERN_ERROR_COMM_MISMATCH,
                   "rank {} sent {} bytes where rank {} expected {}: the ranks called "
                   "the operation with different counts",
                   recv->peer, send->bytes, send->peer, recv->bytes);
    send->Fail(mismatch);
    recv->Fail(mismatch);
    return;
  }
  if (recv->reduce) {
    Reduce(recv->buffer, recv->reduce_a, send->buffer, send->bytes / recv->spec.element_size,
           recv->spec.dtype, recv->spec.op);
  } else if (send->bytes > 0 && recv->buffer != send->buffer) {
    std::memcpy(recv->buffer, send->buffer, send->bytes);
  }
  send->Complete();
  recv->Complete();
}

Request* LocalChannel::MatchOrWait(LocalGroup::Mailbox& box, std::vector<Request*>& waiting,
                                   std::vector<Request*>& mine, Request* req) {
  std::lock_guard<std::mutex> lock(box.mutex);
  auto it = std::find_if(waiting.begin(), waiting.end(),
                         [&](const Request* other) { return other->tag == req->tag; });
  if (it == waiting.end()) {
    mine.push_back(req);
    return nullptr;
  }
  Request* match = *it;
  waiting.erase(it);
  match->state.store(Request::kBusy, std::memory_order_relaxed);
  req->state.store(Request::kBusy, std::memory_order_relaxed);
  return match;
}

Status LocalChannel::PostSend(Request* req) {
  LocalGroup::Mailbox& box = group_->box(req->peer);
  if (Request* recv = MatchOrWait(box, box.recvs, box.sends, req)) Transfer(req, recv);
  return OkStatus();
}

Status LocalChannel::PostRecv(Request* req) {
  LocalGroup::Mailbox& box = group_->box(rank_);
  if (Request* send = MatchOrWait(box, box.sends, box.recvs, req)) Transfer(send, req);
  return OkStatus();
}

void LocalChannel::Cancel(Request* req) {
  LocalGroup::Mailbox& box = group_->box(req->is_send ? req->peer : rank_);
  {
    std::lock_guard<std::mutex> lock(box.mutex);
    auto& list = req->is_send ? box.sends : box.recvs;
    auto it = std::find(list.begin(), list.end(), req);
    if (it != list.end()) {
      list.erase(it);
      return;
    }
  }
  // Matched: the other side is moving the data; it finishes soon.
  while (req->state.load(std::memory_order_acquire) == Request::kBusy) {
  }
}

}  // namespace tern::comm
