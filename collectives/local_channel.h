// LocalChannel: ranks of one communicator that live in this process. A send
// and a receive meet in the receiver's mailbox; whichever is posted second
// moves the data at once, straight from the sender's buffer into (or reduced
// into) the receiver's, and completes both. Nothing is staged or polled.
#ifndef TERN_COLLECTIVES_LOCAL_CHANNEL_H_
#define TERN_COLLECTIVES_LOCAL_CHANNEL_H_

#include <memory>
#include <mutex>
#include <vector>

#include "transport.h"

namespace tern::comm {

// The mailboxes of the ranks of one communicator in this process, shared by
// their channels and found by the communicator's nonce.
class LocalGroup {
 public:
  static std::shared_ptr<LocalGroup> Get(uint64_t nonce, uint32_t size);
  explicit LocalGroup(uint32_t size) : boxes_(size) {}

  struct Mailbox {
    std::mutex mutex;
    std::vector<Request*> recvs;  // posted, unmatched
    std::vector<Request*> sends;  // arrived before their receive
  };
  Mailbox& box(uint32_t rank) { return boxes_[rank]; }

 private:
  std::vector<Mailbox> boxes_;
};

class LocalChannel final : public Channel {
 public:
  LocalChannel(std::shared_ptr<LocalGroup> group, uint32_t rank)
      : group_(std::move(group)), rank_(rank) {}
  const char* name() const override { return "local"; }
  bool FusesReduce() const override { return true; }
  Status PostSend(Request* req) override;
  Status PostRecv(Request* req) override;
  bool Progress(Status*) override { return false; }
  void Cancel(Request* req) override;
  void Shutdown() override {}

 private:
  // Under the box's lock: takes the request of `waiting` (the other side's
  // list) with req's tag, both marked busy; or, when there is none, appends
  // req to `mine` and returns nullptr.
  static Request* MatchOrWait(LocalGroup::Mailbox& box, std::vector<Request*>& waiting,
                              std::vector<Request*>& mine, Request* req);
  static void Transfer(Request* send, Request* recv);
  std::shared_ptr<LocalGroup> group_;
  uint32_t rank_;
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_LOCAL_CHANNEL_H_
