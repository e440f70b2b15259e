// CpuStaging: see cpu_staging.h.
#include "distributed/cpu_staging.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <c10/util/Exception.h>

#include <utility>

namespace torch_tern::distributed {

bool AnyOnCpu(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && t.device().is_cpu()) return true;
  }
  return false;
}

bool AnyOnCpu(const std::vector<std::vector<at::Tensor>>& lists) {
  for (const auto& list : lists) {
    if (AnyOnCpu(list)) return true;
  }
  return false;
}

namespace {

// The Work of an operation on staged tensors. It is complete once the
// operation's Work is and the CPU tensors hold the results: wait(),
// synchronize(), getFuture(), or isCompleted() once the operation has
// finished, copy them back (once; each of those is then cheap).
class StagedWork final : public c10d::Work {
 public:
  StagedWork(int rank, c10::intrusive_ptr<c10d::Work> inner,
             std::vector<CpuStaging::CopyBack> copies, std::vector<at::Tensor> cpu_outputs,
             std::vector<c10::intrusive_ptr<c10d::Work>> also)
      : c10d::Work(rank, inner->retrieveOpType()),
        inner_(std::move(inner)),
        copies_(std::move(copies)),
        cpu_outputs_(std::move(cpu_outputs)),
        also_(std::move(also)) {}

  bool isCompleted() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_) return true;
    }
    if (!inner_->isCompleted()) return false;
    if (!inner_->isSuccess()) return true;  // wait() raises the operation's error
    Complete();
    return true;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return cpu_outputs_; }

  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    Complete();
    return true;
  }
  void synchronize() override { Complete(); }
  void abort() override { inner_->abort(); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    Complete();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) {
      future_ =
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      future_->markCompleted(c10::IValue(cpu_outputs_));
    }
    return future_;
  }

 private:
  // Waits for the operation (its Work makes the current stream wait) and
  // copies each result to its CPU tensor; a copy to the CPU waits for that
  // stream, so the host has the result when this returns.
  void Complete() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    inner_->wait(kNoTimeout);
    for (auto& c : copies_) c.cpu.detach().copy_(c.staged);
    copies_.clear();
    for (auto& work : also_) work->wait(kNoTimeout);
    also_.clear();
    done_ = true;
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  std::mutex mutex_;  // guards done_, copies_, also_, future_
  bool done_ = false;
  std::vector<CpuStaging::CopyBack> copies_;
  std::vector<at::Tensor> cpu_outputs_;
  std::vector<c10::intrusive_ptr<c10d::Work>> also_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

at::Tensor CpuStaging::Stage(const at::Tensor& t, Role role) {
  if (!t.defined() || !t.device().is_cpu()) return t;
  TORCH_CHECK(t.layout() == c10::kStrided,
              "tern: sparse and other non-strided CPU tensors are not supported by the tern "
              "backend; use a group with gloo for them (init_process_group(backend="
              "'cpu:gloo,tern:tern')).");
  at::Tensor staged =
      at::empty(t.sizes(), t.options().device(c10::DeviceType::PrivateUse1, device_));
  if (role != Role::kOut) staged.copy_(t.detach());
  if (role != Role::kIn) copy_backs_.push_back({t, staged});
  return staged;
}

std::vector<at::Tensor> CpuStaging::Stage(const std::vector<at::Tensor>& tensors, Role role) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(Stage(t, role));
  return out;
}

std::vector<std::vector<at::Tensor>> CpuStaging::Stage(
    const std::vector<std::vector<at::Tensor>>& lists, Role role) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& list : lists) out.push_back(Stage(list, role));
  return out;
}

c10::intrusive_ptr<c10d::Work> CpuStaging::Wrap(c10::intrusive_ptr<c10d::Work> work,
                                                std::vector<at::Tensor> cpu_outputs,
                                                std::vector<c10::intrusive_ptr<c10d::Work>> also) {
  return c10::make_intrusive<StagedWork>(rank_, std::move(work), std::exchange(copy_backs_, {}),
                                         std::move(cpu_outputs), std::move(also));
}

}  // namespace torch_tern::distributed
