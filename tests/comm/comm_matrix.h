// The exact-check matrix of the collectives tests: every operation x dtype x
// reduction, in place and out of place, on odd and larger counts, checked
// element by element against values computed independently here. Used by
// the in-process tests (one thread per rank) and by tern_comm_child (one
// process per rank). Public API only.
#ifndef TERN_TESTS_COMM_COMM_MATRIX_H_
#define TERN_TESTS_COMM_COMM_MATRIX_H_

#include <tern/tern.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tern_test {

struct MatrixOptions {
  std::vector<tern_dtype_t> dtypes = {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16,
                                      TERN_DTYPE_I8,  TERN_DTYPE_I32,  TERN_DTYPE_I64};
  // Counts run for every dtype; `large_counts` only for fp32, bf16 and int8
  // (those cross the algorithm thresholds).
  std::vector<uint64_t> counts = {1, 7, 1001};
  std::vector<uint64_t> large_counts = {20001, 100003};
  bool point_to_point = true;
};

struct MatrixResult {
  uint64_t checks = 0;   // operations checked
  std::string failures;  // empty when everything matched
};

// Runs the matrix as `rank` of `size` on `comm`, enqueuing on `queue`
// (a queue of the communicator's core) with buffers on `device`. Every
// rank must call it with the same options.
MatrixResult RunMatrix(tern_comm_t comm, tern_queue_t queue, tern_device_t device, uint32_t rank,
                       uint32_t size, const MatrixOptions& options);

// "TERN_ERROR_X: message" for the last failed call.
std::string LastError(tern_status_t status);

}  // namespace tern_test

#endif  // TERN_TESTS_COMM_COMM_MATRIX_H_
