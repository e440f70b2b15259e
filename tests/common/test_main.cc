// main() for tern's test programs: gives every test process its own
// simulated node (TERN_SIM_NODE=test-<pid>) unless the caller chose one, so
// tests running in parallel never share cores or device memory, and removes
// that node's shared state when the process ends. Child processes inherit
// the variable and so join their parent's node.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

class SimNodeEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* node = std::getenv("TERN_SIM_NODE");
    if (node == nullptr || *node == '\0') {
      name_ = "test-" + std::to_string(getpid());
      setenv("TERN_SIM_NODE", name_.c_str(), 1);
      owned_ = true;
    }
    // Small devices keep tests fast and make out-of-memory easy to reach.
    setenv("TERN_SIM_TOPOLOGY", "2x2x256M", 0);
  }
  void TearDown() override {
    if (owned_) std::remove(("/dev/shm/tern-sim-" + name_).c_str());
  }

 private:
  std::string name_;
  bool owned_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new SimNodeEnvironment);
  return RUN_ALL_TESTS();
}
