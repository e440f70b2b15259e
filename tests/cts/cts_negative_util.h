// Helpers of the CTS negative tests (negative_test.cc for the runtime API,
// cts_executable_negative.cc for executable.h and builder.h): forging
// handles and enum values as a C caller can, too-small struct sizes, and the
// check that failed submissions left a queue as it was.
#ifndef TERN_TESTS_CTS_CTS_NEGATIVE_UTIL_H_
#define TERN_TESTS_CTS_CTS_NEGATIVE_UTIL_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>

#include "cts_fixture.h"

namespace tern::cts {

// The bits of an opaque handle, and a handle made of any bits.
template <typename H>
uintptr_t Bits(H handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

template <typename H>
H Forge(uintptr_t bits) {
  return reinterpret_cast<H>(bits);
}

// Stores any int in an enum field, as a C caller can (in C++ an out-of-range
// enum value cannot be formed by a cast without undefined behaviour).
template <typename E>
void SetRawEnum(E* field, int32_t value) {
  static_assert(sizeof(E) == sizeof(int32_t));
  std::memcpy(field, &value, sizeof(value));
}

// struct_size values too small for a T: none, a field's worth, and one
// byte short. (A type, not an object: the objects are often not yet set.)
template <typename T>
constexpr std::array<uint32_t, 3> TooSmallStructSizes() {
  return {0u, 4u, static_cast<uint32_t>(sizeof(T) - 1)};
}

// After calls that were all refused: nothing completed on `queue`, and the
// next submission, `submit` (which must succeed), takes sequence number 1.
inline void ExpectNoSubmissionTaken(tern_queue_t queue,
                                    const std::function<tern_status_t(uint64_t*)>& submit) {
  uint64_t completed = 99;
  CTS_EXPECT_OK(tern_queue_query(queue, &completed));
  EXPECT_EQ(0u, completed);
  uint64_t sequence = 0;
  CTS_EXPECT_OK(submit(&sequence));
  EXPECT_EQ(1u, sequence) << "a failed submission took a sequence number";
  CTS_EXPECT_OK(tern_queue_synchronize(queue, kLongTimeout));
}

}  // namespace tern::cts

#endif  // TERN_TESTS_CTS_CTS_NEGATIVE_UTIL_H_
