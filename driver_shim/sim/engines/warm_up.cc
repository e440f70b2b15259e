#include "driver_shim/sim/engines/warm_up.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "driver_shim/sim/engines/kernels_internal.h"

namespace tern::sim {
namespace {

// How much stack a thread's first kernels are given already mapped in.
constexpr size_t kWarmStackBytes = 64 * 1024;

struct CodeRange {
  uintptr_t inside;  // an address in the object to find
  bool found = false;
};

int PrefaultObjectCode(struct dl_phdr_info* info, size_t, void* data) {
  auto* range = static_cast<CodeRange*>(data);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && range->inside >= begin && range->inside < begin + ph.p_memsz) {
      holds = true;
    }
  }
  if (!holds) return 0;
  range->found = true;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const uintptr_t begin = (info->dlpi_addr + ph.p_vaddr) / page * page;
    const uintptr_t end = (info->dlpi_addr + ph.p_vaddr + ph.p_memsz + page - 1) / page * page;
#ifdef MADV_POPULATE_READ
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) continue;
#endif
    // Older kernels: the same with a read of each page.
    for (uintptr_t at = begin; at < end; at += page) {
      (void)*reinterpret_cast<volatile const uint8_t*>(at);
    }
  }
  return 1;
}

}  // namespace

void PrefaultKernelCode() {
  static std::once_flag once;
  std::call_once(once, [] {
    CodeRange range{reinterpret_cast<uintptr_t>(&PrefaultKernelCode)};
    dl_iterate_phdr(PrefaultObjectCode, &range);
  });
}

void WarmUpThisThread() {
  // The stack grows down from here; touching a buffer this deep maps its
  // pages. The writes are the point: the barrier keeps them.
  uint8_t stack[kWarmStackBytes];
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t at = 0; at < kWarmStackBytes; at += page) stack[at] = 0;
  asm volatile("" : : "r"(stack) : "memory");
  // A thread's first malloc makes its arena (an mmap and the first pages).
  void* block = std::malloc(256);
  *static_cast<volatile uint8_t*>(block) = 0;
  std::free(block);
  kernels::PrepareDnnlThread();
}

}  // namespace tern::sim
