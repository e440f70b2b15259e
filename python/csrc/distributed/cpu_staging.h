// CPU tensors in a group made with backend="tern": each operation's CPU
// tensors are copied to the group's tern device, the operation runs there on
// the copies, and the Work it returns copies the results back into the CPU
// tensors when it completes.
//
// Decision: NCCL refuses CPU tensors, and torch's default for tern devices
// (init_process_group() with no backend) gives CPU tensors to gloo. But
// training scripts written for one backend reduce CPU scalars too (a loss, a
// token count, an early-stopping flag), and object collectives and barrier
// pick the CPU when the group offers it: refusing those is an error a user
// cannot act on short of rewriting the script. Staging runs them on tern's
// collectives at the price of two copies; bulk CPU traffic belongs on gloo
// ("cpu:gloo,tern:tern"), which docs/torch.md says.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace torch_tern::distributed {

// True when any defined tensor of `tensors` lives on the CPU.
bool AnyOnCpu(const std::vector<at::Tensor>& tensors);
bool AnyOnCpu(const std::vector<std::vector<at::Tensor>>& lists);

// One operation's staging: the tern copies it made and which of them the CPU
// tensors get back. Thread-safety: one thread (the caller's), until Wrap.
class CpuStaging {
 public:
  enum class Role {
    kIn,     // read by the operation: copied to the device
    kOut,    // written by it: copied back, not copied in
    kInOut,  // both (in-place collectives)
  };

  // `rank`: the group rank the Works report; `device`: the group's tern device.
  CpuStaging(int rank, c10::DeviceIndex device) : rank_(rank), device_(device) {}

  // The tern tensor the operation uses in place of `t` (contiguous, same
  // sizes and dtype); `t` itself when it is not a CPU tensor.
  at::Tensor Stage(const at::Tensor& t, Role role);
  std::vector<at::Tensor> Stage(const std::vector<at::Tensor>& tensors, Role role);
  std::vector<std::vector<at::Tensor>> Stage(const std::vector<std::vector<at::Tensor>>& lists,
                                             Role role);

  // The Work to return for `work` (the operation on the staged tensors):
  // it completes once `work` has and the results are back in the CPU
  // tensors, then waits for each of `also` (the staged sends and receives
  // of a coalescing block, which copy back their own); its result() and
  // future hold `cpu_outputs`.
  c10::intrusive_ptr<c10d::Work> Wrap(c10::intrusive_ptr<c10d::Work> work,
                                      std::vector<at::Tensor> cpu_outputs,
                                      std::vector<c10::intrusive_ptr<c10d::Work>> also = {});

  struct CopyBack {
    at::Tensor cpu;
    at::Tensor staged;
  };

 private:
  int rank_;
  c10::DeviceIndex device_;
  std::vector<CopyBack> copy_backs_;
};

}  // namespace torch_tern::distributed
