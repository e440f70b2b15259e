// Element-wise reductions of the collectives, for every dtype and reduction,
// and the names used in messages. No dependencies beyond the public headers,
// so that unit tests can link this piece alone.
//
// Semantics shared by every algorithm and transport:
// - Every reduction is symmetric bit for bit (op(a, b) == op(b, a)), so ranks
//   that combine the same values in a different order agree exactly.
// - Floating MAX and MIN propagate NaN (as a quiet NaN); MAX(+0, -0) is +0
//   and MIN(+0, -0) is -0.
// - bf16 and fp16 are widened to fp32, combined, and rounded back to nearest
//   even after every step.
// - Integer SUM and PROD wrap around (two's complement).
// - AVG combines as SUM; DivideBy() applies the division once at the end
//   (floats: correctly rounded x / n; integers: truncated toward zero).
#ifndef TERN_COLLECTIVES_COMM_KERNELS_H_
#define TERN_COLLECTIVES_COMM_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "tern/comm.h"

namespace tern::comm {

// Whether the kernels reduce `dtype`: every float and integer dtype, not
// bool (it has no arithmetic). Collectives take these dtypes and no other,
// even the operations that only move bytes, so that one rule covers them all.
bool IsReducible(tern_dtype_t dtype);

// "sum", "prod", "max", "min", "avg".
const char* RedopName(tern_comm_redop_t op);

// dst[i] = op(a[i], b[i]) for i < count. dst may be a or b (exactly), but
// must not partially overlap them.
void Reduce(void* dst, const void* a, const void* b, size_t count, tern_dtype_t dtype,
            tern_comm_redop_t op);

// dst[i] = src[i] / divisor: the last step of AVG. dst may be src.
void DivideBy(void* dst, const void* src, size_t count, tern_dtype_t dtype, uint32_t divisor);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_COMM_KERNELS_H_
