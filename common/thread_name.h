// Names the calling thread, so that `top -H`, `ps -L`, gdb and /proc show
// which of a process's threads belong to tern and what each does. Linux keeps
// 15 bytes of a name; a longer one is cut there.
//
// Thread safety: names only the calling thread; safe from any thread.
#ifndef TERN_COMMON_THREAD_NAME_H_
#define TERN_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <algorithm>
#include <cstring>

namespace tern {

inline void NameThisThread(const char* name) {
  char truncated[16] = {};
  std::memcpy(truncated, name, std::min(std::strlen(name), sizeof(truncated) - 1));
  // Failure only costs the name; nothing depends on it.
  (void)pthread_setname_np(pthread_self(), truncated);
}

}  // namespace tern

#endif  // TERN_COMMON_THREAD_NAME_H_
