#include "fabric_channel.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "signal_disposition_guard.h"

namespace tern::comm {
namespace {

constexpr uint64_t kPageSize = 4096;

bool EnvFlag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] == '1';
}

fi_info* MakeHints(const FabricLibrary& lib, const char* provider) {
  fi_info* hints = lib.dupinfo(nullptr);  // fi_allocinfo()
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->tx_attr->msg_order = 0;
  hints->rx_attr->msg_order = 0;
  if (provider != nullptr) hints->fabric_attr->prov_name = strdup(provider);
  return hints;
}

// Among the entries of one provider: the wanted interface (for tcp the
// domain is the interface), else IPv4 over a real interface, else anything.
fi_info* PickEntry(fi_info* list, bool local_only) {
  const char* wanted = std::getenv("TERN_COMM_SOCKET_IFNAME");
  if (wanted != nullptr && *wanted == '\0') wanted = nullptr;
  fi_info* best = nullptr;
  int best_score = -1;
  for (fi_info* info = list; info != nullptr; info = info->next) {
    const char* domain = info->domain_attr != nullptr ? info->domain_attr->name : nullptr;
    int score = 0;
    if (info->addr_format == FI_SOCKADDR_IN) score += 2;
    const bool loopback = domain != nullptr && std::strcmp(domain, "lo") == 0;
    if (!loopback || local_only) score += 4;
    if (wanted != nullptr && domain != nullptr && std::strcmp(domain, wanted) == 0) score += 8;
    if (score > best_score) {
      best = info;
      best_score = score;
    }
  }
  return best;
}

}  // namespace

Status FabricChannel::FiStatus(int rc, const char* what) const {
  return MakeStatus(TERN_ERROR_COMM_TRANSPORT, "libfabric {} failed: {} ({})", what,
                    lib_->strerror(-rc), rc);
}

Status FabricChannel::Open(bool local_only, uint32_t size, std::unique_ptr<FabricChannel>* out) {
  // Providers are loaded and initialised below (fi_getinfo, fi_fabric,
  // fi_domain, fi_endpoint): keep the program's signal handling throughout.
  SignalDispositionGuard keep_signals;
  const FabricLibrary* lib = nullptr;
  TERN_RETURN_IF_ERROR(FabricLibrary::Get(&lib));
  std::vector<const char*> candidates;
  const char* forced = std::getenv("FI_PROVIDER");
  if (forced != nullptr && *forced != '\0') {
    candidates.push_back(nullptr);  // libfabric applies FI_PROVIDER itself
  } else if (local_only) {
    candidates = {"shm", "tcp"};
  } else {
    candidates = {"efa", "tcp"};
  }
  std::string tried;
  for (const char* provider : candidates) {
    fi_info* hints = MakeHints(*lib, provider);
    fi_info* list = nullptr;
    const int rc = lib->getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list);
    lib->freeinfo(hints);
    tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", provider ? provider : forced,
                         rc == 0 ? "ok" : lib->strerror(-rc));
    if (rc != 0 || list == nullptr) continue;
    fi_info* pick = PickEntry(list, local_only);
    std::unique_ptr<FabricChannel> channel(new FabricChannel(lib));
    Status status = channel->Init(lib->dupinfo(pick));
    lib->freeinfo(list);
    if (!status.ok()) {
      tried += fmt::format(" ({})", status.message());
      continue;
    }
    channel->peer_addr_.assign(size, FI_ADDR_UNSPEC);
    *out = std::move(channel);
    return OkStatus();
  }
  return MakeStatus(
      TERN_ERROR_COMM_TRANSPORT,
      "no libfabric provider offers reliable tagged messaging here (tried {}); install "
      "libfabric with the efa, shm or tcp provider, or unset FI_PROVIDER if it names "
      "one that is missing",
      tried);
}

Status FabricChannel::Init(fi_info* info) {
  info_ = info;
  provider_ = info->fabric_attr->prov_name;
  inject_size_ = info->tx_attr->inject_size;
  register_memory_ =
      (info->domain_attr->mr_mode & FI_MR_LOCAL) != 0 || EnvFlag("TERN_COMM_FABRIC_REGISTER");
  int rc = lib_->fabric(info->fabric_attr, &fabric_, nullptr);
  if (rc != 0) return FiStatus(rc, "fi_fabric");
  rc = fi_domain(fabric_, info, &domain_, nullptr);
  if (rc != 0) return FiStatus(rc, "fi_domain");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 4096;
  rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
  if (rc != 0) return FiStatus(rc, "fi_cq_open");
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  rc = fi_av_open(domain_, &av_attr, &av_, nullptr);
  if (rc != 0) return FiStatus(rc, "fi_av_open");
  rc = fi_endpoint(domain_, info, &ep_, nullptr);
  if (rc != 0) return FiStatus(rc, "fi_endpoint");
  rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return FiStatus(rc, "fi_ep_bind(cq)");
  rc = fi_ep_bind(ep_, &av_->fid, 0);
  if (rc != 0) return FiStatus(rc, "fi_ep_bind(av)");
  rc = fi_enable(ep_);
  if (rc != 0) return FiStatus(rc, "fi_enable");
  char name[256];
  size_t length = sizeof(name);
  rc = fi_getname(&ep_->fid, name, &length);
  if (rc != 0) return FiStatus(rc, "fi_getname");
  address_.assign(name, length);
  TERN_LOG_DEBUG("fabric endpoint: provider {} domain {} inject {} register {}", provider_,
                 info->domain_attr->name, inject_size_, register_memory_);
  return OkStatus();
}

FabricChannel::~FabricChannel() {
  std::lock_guard<std::mutex> lock(mutex_);
  CloseAll();
  if (info_ != nullptr) lib_->freeinfo(info_);
}

void FabricChannel::CloseAll() {
  if (ep_ != nullptr) fi_close(&ep_->fid);
  ep_ = nullptr;
  for (auto& [start, registration] : registrations_) fi_close(&registration.mr->fid);
  registrations_.clear();
  if (av_ != nullptr) fi_close(&av_->fid);
  av_ = nullptr;
  if (cq_ != nullptr) fi_close(&cq_->fid);
  cq_ = nullptr;
  if (domain_ != nullptr) fi_close(&domain_->fid);
  domain_ = nullptr;
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  fabric_ = nullptr;
  backlog_.clear();
}

Status FabricChannel::AddPeers(const std::vector<std::pair<uint32_t, std::string>>& peers) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [rank, address] : peers) {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    const int rc = fi_av_insert(av_, address.data(), 1, &addr, 0, nullptr);
    if (rc != 1) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "libfabric ({}) could not insert the address of rank {} ({} bytes): {}",
                        provider_, rank, address.size(),
                        rc < 0 ? lib_->strerror(-rc) : "not inserted");
    }
    peer_addr_[rank] = addr;
  }
  return OkStatus();
}

void* FabricChannel::Descriptor(const void* buffer, size_t bytes, Status* error) {
  if (!register_memory_ || bytes == 0) return nullptr;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(buffer);
  const uintptr_t end = begin + bytes;
  auto it = registrations_.upper_bound(begin);
  if (it != registrations_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end >= end) return fi_mr_desc(prev->second.mr);
  }
  const uintptr_t start = begin & ~(kPageSize - 1);
  const uintptr_t stop = (end + kPageSize - 1) & ~(kPageSize - 1);
  fid_mr* mr = nullptr;
  const int rc = fi_mr_reg(domain_, reinterpret_cast<void*>(start), stop - start, FI_SEND | FI_RECV,
                           0, 0, 0, &mr, nullptr);
  if (rc != 0) {
    *error = FiStatus(rc, "fi_mr_reg (memory registration)");
    return nullptr;
  }
  registrations_[start] = Registration{stop, mr};
  return fi_mr_desc(mr);
}

Status FabricChannel::TryPost(Request* req, bool* again) {
  *again = false;
  if (shut_) return MakeStatus(TERN_ERROR_COMM_ABORTED, "the fabric endpoint was closed");
  Status error;
  void* desc = Descriptor(req->is_send ? req->buffer : (req->staging ? req->staging : req->buffer),
                          req->bytes, &error);
  if (!error.ok()) return error;
  ssize_t rc;
  if (req->is_send) {
    const fi_addr_t dest = peer_addr_[req->peer];
    if (req->bytes <= inject_size_) {
      rc = fi_tinject(ep_, req->buffer, req->bytes, dest, req->tag);
      if (rc == 0) {
        req->Complete();
        return OkStatus();
      }
    } else {
      rc = fi_tsend(ep_, req->buffer, req->bytes, desc, dest, req->tag, &req->context);
    }
  } else {
    void* into = req->staging != nullptr ? req->staging : req->buffer;
    rc = fi_trecv(ep_, into, req->bytes, desc, FI_ADDR_UNSPEC, req->tag, 0, &req->context);
  }
  if (rc == -FI_EAGAIN) {
    *again = true;
    return OkStatus();
  }
  if (rc != 0) return FiStatus(static_cast<int>(rc), req->is_send ? "fi_tsend" : "fi_trecv");
  return OkStatus();
}

Status FabricChannel::PostSend(Request* req) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!backlog_.empty()) {
    backlog_.push_back(req);  // keep the order of posts
    return OkStatus();
  }
  bool again = false;
  TERN_RETURN_IF_ERROR(TryPost(req, &again));
  if (again) backlog_.push_back(req);
  return OkStatus();
}

Status FabricChannel::PostRecv(Request* req) { return PostSend(req); }

bool FabricChannel::Progress(Status* error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_) return false;
  bool progressed = false;
  fi_cq_tagged_entry entries[16];
  while (true) {
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n > 0) {
      progressed = true;
      for (ssize_t i = 0; i < n; ++i) {
        auto* req = reinterpret_cast<Request*>(reinterpret_cast<char*>(entries[i].op_context) -
                                               offsetof(Request, context));
        if (!req->is_send && entries[i].len != req->bytes) {
          req->Fail(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                               "rank {} sent {} bytes where {} were expected: the ranks called the "
                               "operation with different counts",
                               req->peer, entries[i].len, req->bytes));
          continue;
        }
        req->Complete();
      }
      if (n < 16) break;
      continue;
    }
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) <= 0) break;
      progressed = true;
      if (err.op_context == nullptr) continue;
      auto* req = reinterpret_cast<Request*>(reinterpret_cast<char*>(err.op_context) -
                                             offsetof(Request, context));
      if (err.err == FI_ECANCELED) {
        req->Fail(MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                             "libfabric ({}) cancelled the {} with rank {}: its connection broke",
                             provider_, req->is_send ? "send" : "receive", req->peer));
      } else if (err.err == FI_ETRUNC) {
        req->Fail(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                             "rank {} sent more than the {} bytes expected: the ranks called the "
                             "operation with different counts",
                             req->peer, req->bytes));
      } else {
        char text[256] = {};
        fi_cq_strerror(cq_, err.prov_errno, err.err_data, text, sizeof(text));
        req->Fail(MakeStatus(
            TERN_ERROR_COMM_TRANSPORT, "libfabric ({}) {} with rank {} failed: {} ({})", provider_,
            req->is_send ? "send" : "receive", req->peer, lib_->strerror(err.err), text));
      }
      continue;
    }
    *error = FiStatus(static_cast<int>(n), "fi_cq_read");
    return progressed;
  }
  while (!backlog_.empty()) {
    bool again = false;
    Status status = TryPost(backlog_.front(), &again);
    if (again) break;
    Request* req = backlog_.front();
    backlog_.pop_front();
    progressed = true;
    if (!status.ok()) req->Fail(status);
  }
  return progressed;
}

void FabricChannel::Cancel(Request* req) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find(backlog_.begin(), backlog_.end(), req);
  if (it != backlog_.end()) {
    backlog_.erase(it);
    return;
  }
  // Posted to the provider: the communicator shuts the endpoint down before
  // cancelling, after which the provider no longer holds the request.
}

void FabricChannel::Shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_) return;
  shut_ = true;
  CloseAll();
}

}  // namespace tern::comm
