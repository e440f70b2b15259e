// torch_tern._C's torch.distributed functions (torch_tern/distributed.py).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tern::distributed {

// Adds _distributed_free_cores() (cores no process owns, node-wide),
// _distributed_comm_counts() (see GetCommCounts) and
// _distributed_init() to the module: called by torch_tern.distributed
// once torch.distributed is imported (the c10d classes it derives from are
// registered with Python only then), it defines _C._ProcessGroupTern.
// Thread-safety: called once, at module init.
void RegisterDistributedBindings(pybind11::module& module);

}  // namespace torch_tern::distributed
