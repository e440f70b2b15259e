// The pause a spinning thread takes between two looks at a shared value: it
// tells the CPU that this is a spin loop (no speculative loads to unwind
// when the value changes, and the core's sibling thread gets the cycles).
//
// Thread safety: any thread.
#ifndef TERN_COMMON_CPU_RELAX_H_
#define TERN_COMMON_CPU_RELAX_H_

namespace tern {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace tern

#endif  // TERN_COMMON_CPU_RELAX_H_
