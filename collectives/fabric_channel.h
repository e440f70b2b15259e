// FabricChannel: ranks reached through libfabric. One RDM endpoint per
// communicator rank with its own completion queue and address vector;
// tagged messages (fi_tsend / fi_trecv, fi_tinject for what fits); progress
// is manual: the thread that waits for a request reads the completion queue.
//
// Provider choice: FI_PROVIDER, when set, is left to libfabric (it filters
// the providers itself); otherwise "shm" for ranks of this host when tern's
// own shared-memory channel is off, and "efa", then "tcp" for other hosts.
// Memory is registered (a cache of page-aligned ranges) when the provider
// asks for it (FI_MR_LOCAL) or TERN_COMM_FABRIC_REGISTER=1.
//
// libfabric is loaded by the first Open (FabricLibrary), with the program's
// signal handling kept across the load and the providers' initialisation
// (SignalDispositionGuard; docs/runtime.md, "Signals and libfabric loading").
#ifndef TERN_COLLECTIVES_FABRIC_CHANNEL_H_
#define TERN_COLLECTIVES_FABRIC_CHANNEL_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric_library.h"
#include "transport.h"

namespace tern::comm {

class FabricChannel final : public Channel {
 public:
  // `local_only`: every peer of this channel is on this host. Loads
  // libfabric on first use; fails with TERN_ERROR_COMM_TRANSPORT when it
  // cannot be loaded or no provider fits.
  // Thread-safety: any thread (opens are serialised process-wide).
  static Status Open(bool local_only, uint32_t size, std::unique_ptr<FabricChannel>* out);
  ~FabricChannel() override;

  const char* name() const override { return provider_.c_str(); }
  bool FusesReduce() const override { return false; }
  // The endpoint's address, to give to the peers.
  const std::string& address() const { return address_; }
  // Inserts the peers' addresses (by rank) into the address vector.
  Status AddPeers(const std::vector<std::pair<uint32_t, std::string>>& peers);

  Status PostSend(Request* req) override;
  Status PostRecv(Request* req) override;
  bool Progress(Status* error) override;
  void Cancel(Request* req) override;
  void Shutdown() override;

 private:
  explicit FabricChannel(const FabricLibrary* lib) : lib_(lib) {}
  Status Init(fi_info* info);
  Status FiStatus(int rc, const char* what) const;
  Status TryPost(Request* req, bool* again);                          // caller holds mutex_
  void* Descriptor(const void* buffer, size_t bytes, Status* error);  // caller holds mutex_
  void CloseAll();                                                    // caller holds mutex_

  const FabricLibrary* const lib_;
  std::mutex mutex_;  // the domain is FI_THREAD_DOMAIN: one thread in it at a time
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  std::string provider_;
  std::string address_;
  size_t inject_size_ = 0;
  bool register_memory_ = false;
  bool shut_ = false;
  std::vector<fi_addr_t> peer_addr_;
  std::deque<Request*> backlog_;  // posts the provider refused for now (-FI_EAGAIN)
  struct Registration {
    uintptr_t end;
    fid_mr* mr;
  };
  std::map<uintptr_t, Registration> registrations_;  // by start address
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_FABRIC_CHANNEL_H_
