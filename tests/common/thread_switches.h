// Tests that watch a thread of their own process sleep or wake: the
// voluntary context switches of its threads, from /proc/self/task. A thread
// asleep on a futex does not switch; one that naps (futex waits with a
// timeout) switches once a nap.
#ifndef TERN_TESTS_COMMON_THREAD_SWITCHES_H_
#define TERN_TESTS_COMMON_THREAD_SWITCHES_H_

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace tern::testing {

// Each of this process's threads named `name`, by thread id, with its count
// of voluntary context switches.
// Thread-safety: any thread.
inline std::map<int, long> SwitchesOfThreadsNamed(const std::string& name) {
  std::map<int, long> switches;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    if (!std::getline(comm, thread_name) || thread_name != name) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        switches[std::stoi(task.path().filename().string())] = std::stol(line.substr(24));
      }
    }
  }
  return switches;
}

}  // namespace tern::testing

#endif  // TERN_TESTS_COMMON_THREAD_SWITCHES_H_
