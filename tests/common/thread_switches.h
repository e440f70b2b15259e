// Tests that watch a thread of their own process sleep or wake: the
// voluntary context switches of its threads, from /proc/self/task. A thread
// asleep on a futex does not switch; one that naps (futex waits with a
// timeout) switches once a nap.
#ifndef TERN_TESTS_COMMON_THREAD_SWITCHES_H_
#define TERN_TESTS_COMMON_THREAD_SWITCHES_H_

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

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

// SwitchesOfThreadsNamed(name) once `count` such threads exist (a thread
// names itself once it runs), or the last look after 2 s.
// Thread-safety: any thread.
inline std::map<int, long> WhenRunning(const std::string& name, size_t count) {
  std::map<int, long> now = SwitchesOfThreadsNamed(name);
  for (int tries = 0; tries < 2000 && now.size() < count; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    now = SwitchesOfThreadsNamed(name);
  }
  return now;
}

// SwitchesOfThreadsNamed(name) once five looks 5 ms apart agree (every such
// thread asleep), or the last look after 2 s. Two looks were not enough: in
// the ThreadSanitizer build, beside another test, an engine still taking its
// naps went 5 ms without a switch (waiting for a CPU) and was taken for
// asleep.
// Thread-safety: any thread.
inline std::map<int, long> WhenAsleep(const std::string& name) {
  constexpr int kAgreeingLooks = 5;
  std::map<int, long> before, now = SwitchesOfThreadsNamed(name);
  int agreeing = 1;
  for (int tries = 0; tries < 400 && agreeing < kAgreeingLooks; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    before = now;
    now = SwitchesOfThreadsNamed(name);
    agreeing = now == before ? agreeing + 1 : 1;
  }
  return now;
}

// SwitchesOfThreadsNamed(name) once thread `thread` has switched at least
// `count` times more than `since` says, or the last look after 2 s. For a
// thread expected to nap: on a loaded machine it may wait milliseconds for a
// CPU, so a look after a fixed time can come too early.
// Thread-safety: any thread.
inline std::map<int, long> WhenSwitched(const std::string& name, int thread,
                                        const std::map<int, long>& since, long count) {
  const auto reached = [&](const std::map<int, long>& now) {
    const auto at = now.find(thread), before = since.find(thread);
    return at != now.end() && before != since.end() && at->second - before->second >= count;
  };
  std::map<int, long> now = SwitchesOfThreadsNamed(name);
  for (int tries = 0; tries < 2000 && !reached(now); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    now = SwitchesOfThreadsNamed(name);
  }
  return now;
}

}  // namespace tern::testing

#endif  // TERN_TESTS_COMMON_THREAD_SWITCHES_H_
