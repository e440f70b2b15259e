/* tern — the instruction set of executables (docs/isa.md has the full text).
 *
 * A macro-op ISA over device memory. Each instruction names its operands as
 * tensors in segments (an input or output of the function, the constants,
 * the scratch) with a byte offset, a dtype, a shape and strides in elements.
 * Stride 0 repeats an element: that is how broadcasting is written. Extra
 * parameters travel as a list of integers and a list of floats whose meaning
 * each opcode defines. Opcodes are grouped by the engine that runs them; the
 * high byte of an opcode is its engine. Enums only ever grow.
 */
#ifndef TERN_ISA_H_
#define TERN_ISA_H_

#include <stdint.h>

#include "tern/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_MAX_RANK 8

typedef enum tern_dtype_t TERN_ENUM_BASE {
  TERN_DTYPE_F32 = 0,
  TERN_DTYPE_BF16 = 1,
  TERN_DTYPE_F16 = 2,
  TERN_DTYPE_I8 = 3,
  TERN_DTYPE_I32 = 4,
  TERN_DTYPE_I64 = 5,
  TERN_DTYPE_BOOL = 6, /* one byte, 0 or 1 */
  TERN_DTYPE_F64 = 7,  /* feature TERN_FEATURE_F64: copies, casts, fills and Vector elementwise
                          arithmetic only (docs/isa.md) */
  TERN_DTYPE_COUNT = 8
} tern_dtype_t;

/* Bytes of one element of `dtype` (TERN_DTYPE_BOOL: 1), or 0 for a value this
 * version does not know.
 * Thread-safety: safe from any thread; callable before tern_init(). */
TERN_API uint64_t tern_dtype_size(tern_dtype_t dtype);

/* The short name of `dtype` ("f32", "bf16", "f16", "i8", "i32", "i64",
 * "bool"), or "unknown" for a value this version does not know. Never NULL.
 * Thread-safety: safe from any thread; callable before tern_init(). */
TERN_API const char* tern_dtype_name(tern_dtype_t dtype);

typedef enum tern_segment_t TERN_ENUM_BASE {
  TERN_SEGMENT_INPUT = 0,    /* input `index` of the function */
  TERN_SEGMENT_OUTPUT = 1,   /* output `index` of the function */
  TERN_SEGMENT_CONSTANT = 2, /* the executable's constants */
  TERN_SEGMENT_SCRATCH = 3,  /* per-execution scratch memory of the function */
  TERN_SEGMENT_NONE = 255    /* an optional operand that is absent */
} tern_segment_t;

typedef enum tern_engine_t TERN_ENUM_BASE {
  TERN_ENGINE_DMA = 1,
  TERN_ENGINE_TENSOR = 2,
  TERN_ENGINE_VECTOR = 3,
  TERN_ENGINE_SCALAR = 4,
  TERN_ENGINE_GPSIMD = 5,
  TERN_ENGINE_COLLECTIVE = 6,
  TERN_ENGINE_SYNC = 7
} tern_engine_t;

/* Operands are listed outputs first. ints/floats are per opcode. */
typedef enum tern_opcode_t TERN_ENUM_BASE {
  /* DMA */
  TERN_OP_COPY = 0x0100, /* [dst, src] same dtype and shape; any strides */
  TERN_OP_CAST = 0x0101, /* [dst, src] same shape; float->int truncates, ->bool is != 0 */
  TERN_OP_FILL = 0x0102, /* [dst] floats[0] value (ints[0] for integer dtypes, exact) */

  /* Tensor */
  TERN_OP_MATMUL = 0x0200, /* [out, a, b, bias?, residual?] a [...,M,K] b [...,K,N] out [...,M,N];
                              ints [transpose_a, transpose_b, activation=-1]; floats [alpha=1,
                              beta=0, activation parameters...]: out = act(alpha * a@b +
                              beta * out (+ bias broadcast over rows) (+ residual)) */
  /* CONV2D: [out, input NCHW, weight OIHW, bias?, residual?];
     ints [stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, activation=-1];
     floats: the activation's parameters. out = act(conv + bias + residual) */
  TERN_OP_CONV2D = 0x0201,
  TERN_OP_CONV2D_BACKWARD_INPUT = 0x0202,  /* [grad_input, grad_out, weight]; ints as CONV2D */
  TERN_OP_CONV2D_BACKWARD_WEIGHT = 0x0203, /* [grad_weight, grad_out, input]; ints as CONV2D */

  /* Vector */
  TERN_OP_BINARY = 0x0300,  /* [out, a, b] ints[0] tern_binary_fn_t; a, b have out's shape
                               (stride 0 broadcasts); comparisons write BOOL */
  TERN_OP_WHERE = 0x0301,   /* [out, cond BOOL, a, b] */
  TERN_OP_REDUCE = 0x0302,  /* [out, in] ints[0] tern_reduce_fn_t, ints[1..] axes; out has in's
                               rank with reduced axes of size 1; ARGMAX/ARGMIN write I64 */
  TERN_OP_SOFTMAX = 0x0303, /* [out, in] ints [axis, log (0 softmax, 1 log-softmax)] */
  TERN_OP_SOFTMAX_BACKWARD = 0x0304, /* [grad_in, grad_out, out] ints [axis, log] */
  TERN_OP_LAYER_NORM = 0x0305, /* [out, mean?, rstd?, in, weight?, bias?] over the last ints[0]
                                  axes; floats[0] eps; mean/rstd have the leading shape */
  TERN_OP_LAYER_NORM_BACKWARD = 0x0306, /* [grad_in, grad_weight?, grad_bias?, grad_out, in,
                                           mean, rstd, weight?] ints[0] normalized axes */
  TERN_OP_RMS_NORM = 0x0307,            /* [out, rstd?, in, weight?] ints[0] axes; floats[0] eps */
  TERN_OP_RMS_NORM_BACKWARD = 0x0308,   /* [grad_in, grad_weight?, grad_out, in, rstd, weight?] */
  TERN_OP_ELEMENTWISE = 0x0309,         /* a fused elementwise program (feature
                                           TERN_FEATURE_ELEMENTWISE_PROGRAMS): [out0, out1?, out2?, out3?,
                                           in0, in1?, ..., in7?] all of out0's shape; ints [steps,
                                           step (kind, fn, a, b, c) x steps, reg0, reg1, reg2, reg3];
                                           floats: constants and parameters. docs/isa.md */
  TERN_OP_SCAN = 0x030A, /* an inclusive scan (feature TERN_FEATURE_SCAN): [out, in] same shape;
                            ints [tern_scan_fn_t, axis]: out[.., i, ..] = fn of in[.., 0..i, ..].
                            Same dtypes, or out i64 and in an integer or bool (SUM, PROD); f32
                            accumulates in f64, bf16/f16 in f32, integers in i64 (wrapping) */

  /* Scalar (activation functions) */
  TERN_OP_UNARY = 0x0400,          /* [out, in] ints[0] tern_unary_fn_t; floats: parameters */
  TERN_OP_UNARY_BACKWARD = 0x0401, /* [grad_in, grad_out, in] ints[0] tern_unary_fn_t */

  /* GpSimd */
  TERN_OP_GATHER = 0x0500,          /* [out, table, indices] ints[0] axis: out = table indexed along
                                       axis by indices; out.shape = t[:axis] + idx.shape + t[axis+1:] */
  TERN_OP_SCATTER_ADD = 0x0501,     /* [out, indices, src] ints[0] axis: the adjoint of GATHER,
                                       adds src into out (out is read and written) */
  TERN_OP_TAKE_ALONG_AXIS = 0x0502, /* [out, in, indices] ints[0] axis (torch.gather) */
  TERN_OP_SCATTER_ADD_ALONG_AXIS = 0x0503, /* [out, indices, src] ints[0] axis */
  TERN_OP_IOTA = 0x0504,                   /* [out] ints[0] axis; floats [start, step] */
  TERN_OP_RANDOM = 0x0505,  /* [out] ints [tern_random_fn_t, seed, offset]; floats: parameters.
                               Counter-based (Philox4x32-10): same seed and offset, same bits */
  TERN_OP_SORT = 0x0506,    /* a stable sort (feature TERN_FEATURE_SORT): [values, indices I64, in]
                               all of in's shape; ints [axis, descending 0/1]. Equal keys keep
                               their order; NaN sorts above +inf (last ascending, first
                               descending); -0.0 equals 0.0 */
  TERN_OP_TOPK = 0x0507,    /* the k largest or smallest (feature TERN_FEATURE_SORT): [values,
                               indices I64, in]; values and indices have in's shape but k along
                               axis (0 <= k <= in's); ints [axis, largest 0/1]. Written in SORT's
                               order of the whole axis (best first, equal keys by index) */
  TERN_OP_SCATTER = 0x0508, /* the overwriting adjoint of GATHER (feature TERN_FEATURE_SCATTER):
                               [out, indices, src] ints[0] axis, shapes as SCATTER_ADD;
                               out[p, indices[j], q] = src[p, j, q]. Any dtype. Duplicate
                               indices: the last in index order (row-major) wins */
  TERN_OP_SCATTER_ALONG_AXIS = 0x0509, /* torch.scatter (feature TERN_FEATURE_SCATTER): [out,
                                          indices, src] ints[0] axis, shapes as
                                          SCATTER_ADD_ALONG_AXIS; out[p with p[axis] =
                                          indices[p]] = src[p]. Any dtype. Indices in
                                          [0, size) only (torch.scatter's rule). Duplicates
                                          along the axis: the last position wins */

  /* Collective (reserved: validated, not yet executable) */
  TERN_OP_ALL_REDUCE = 0x0600,

  /* Sync: semaphores between the engines of a core. No operands. A sync
   * instruction runs on no engine of its own: it orders the engine stream
   * that holds it. In a file (docs/executable-format.md) its ints are the
   * two below and the stream says the engine. tern_builder_add_instruction()
   * cannot guess the stream, so there it takes a third int, the
   * tern_engine_t of the stream (TERN_ENGINE_DMA to TERN_ENGINE_COLLECTIVE):
   * [semaphore, increment, engine] and [semaphore, value, engine]; the
   * builder puts the instruction in that engine's stream of `core` and
   * stores the first two ints. Semaphores 0..255 per core, all 0 when an
   * execution starts; increment 1..2^32, value 0..2^40. */
  TERN_OP_SEM_SIGNAL = 0x0700, /* ints [semaphore, increment] (builder: + engine): adds
                                  increment once the stream's earlier instructions are done */
  TERN_OP_SEM_WAIT = 0x0701    /* ints [semaphore, value] (builder: + engine): the rest of
                                  the stream waits until semaphore >= value */
} tern_opcode_t;

typedef enum tern_unary_fn_t TERN_ENUM_BASE {
  TERN_UNARY_NEG = 0,
  TERN_UNARY_ABS,
  TERN_UNARY_EXP,
  TERN_UNARY_LOG,
  TERN_UNARY_SQRT,
  TERN_UNARY_RSQRT,
  TERN_UNARY_SIN,
  TERN_UNARY_COS,
  TERN_UNARY_TANH,
  TERN_UNARY_SIGMOID,
  TERN_UNARY_RELU,
  TERN_UNARY_GELU,
  TERN_UNARY_GELU_TANH,
  TERN_UNARY_SILU,
  TERN_UNARY_ERF,
  TERN_UNARY_FLOOR,
  TERN_UNARY_CEIL,
  TERN_UNARY_ROUND,
  TERN_UNARY_TRUNC,
  TERN_UNARY_SIGN,
  TERN_UNARY_RECIPROCAL,
  TERN_UNARY_LOGICAL_NOT,
  TERN_UNARY_EXPM1,
  TERN_UNARY_LOG1P,
  TERN_UNARY_SQUARE,
  TERN_UNARY_LEAKY_RELU /* floats[0] slope */,
  TERN_UNARY_ELU /* floats[0] alpha */,
  TERN_UNARY_POW_SCALAR /* floats[0] exponent */,
  TERN_UNARY_CLAMP /* floats[0] min, floats[1] max */,
  TERN_UNARY_AFFINE /* floats[0] * x + floats[1] */,
  TERN_UNARY_SOFTPLUS,
  TERN_UNARY_ISNAN,
  TERN_UNARY_LOG2,
  TERN_UNARY_EXP2,
  TERN_UNARY_TAN,
  TERN_UNARY_ASIN,
  TERN_UNARY_ACOS,
  TERN_UNARY_ATAN,
  TERN_UNARY_SINH,
  TERN_UNARY_COSH,
  TERN_UNARY_HARDSIGMOID,
  TERN_UNARY_HARDSWISH,
  TERN_UNARY_MISH,
  TERN_UNARY_BITWISE_NOT,
  TERN_UNARY_COUNT
} tern_unary_fn_t;

typedef enum tern_binary_fn_t TERN_ENUM_BASE {
  TERN_BINARY_ADD = 0,
  TERN_BINARY_SUB,
  TERN_BINARY_MUL,
  TERN_BINARY_DIV,
  TERN_BINARY_POW,
  TERN_BINARY_MAX,
  TERN_BINARY_MIN,
  TERN_BINARY_EQ,
  TERN_BINARY_NE,
  TERN_BINARY_LT,
  TERN_BINARY_LE,
  TERN_BINARY_GT,
  TERN_BINARY_GE,
  TERN_BINARY_LOGICAL_AND,
  TERN_BINARY_LOGICAL_OR,
  TERN_BINARY_LOGICAL_XOR,
  TERN_BINARY_REMAINDER /* sign of divisor */,
  TERN_BINARY_FMOD,
  TERN_BINARY_ATAN2,
  TERN_BINARY_BITWISE_AND,
  TERN_BINARY_BITWISE_OR,
  TERN_BINARY_BITWISE_XOR,
  TERN_BINARY_FLOOR_DIVIDE,
  TERN_BINARY_COPYSIGN,
  TERN_BINARY_COUNT
} tern_binary_fn_t;

typedef enum tern_reduce_fn_t TERN_ENUM_BASE {
  TERN_REDUCE_SUM = 0,
  TERN_REDUCE_MEAN,
  TERN_REDUCE_MAX,
  TERN_REDUCE_MIN,
  TERN_REDUCE_PROD,
  TERN_REDUCE_ARGMAX,
  TERN_REDUCE_ARGMIN,
  TERN_REDUCE_ANY,
  TERN_REDUCE_ALL,
  TERN_REDUCE_COUNT
} tern_reduce_fn_t;

/* The function of a SCAN. MAX and MIN propagate NaN (once a NaN is seen,
 * the rest of the run is NaN), as PyTorch's cummax/cummin do. */
typedef enum tern_scan_fn_t TERN_ENUM_BASE {
  TERN_SCAN_SUM = 0,
  TERN_SCAN_PROD,
  TERN_SCAN_MAX,
  TERN_SCAN_MIN,
  TERN_SCAN_COUNT
} tern_scan_fn_t;

/* The kinds of step of an ELEMENTWISE program. Registers 0..7 hold inputs
 * in0..in7 as f32; step i writes register 8 + i. */
typedef enum tern_program_step_t TERN_ENUM_BASE {
  TERN_STEP_CONSTANT = 0, /* [0, 0, k, 0, 0]: floats[k] */
  TERN_STEP_UNARY = 1,    /* [1, tern_unary_fn_t, src, first parameter in floats, 0] */
  TERN_STEP_BINARY = 2,   /* [2, tern_binary_fn_t, a, b, 0] */
  TERN_STEP_WHERE = 3,    /* [3, 0, cond, a, b]: cond != 0 ? a : b */
  TERN_STEP_COUNT
} tern_program_step_t;

/* Registers of an ELEMENTWISE program: inputs, then one per step. */
#define TERN_PROGRAM_INPUTS 8
#define TERN_PROGRAM_OUTPUTS 4
#define TERN_PROGRAM_MAX_STEPS 64
#define TERN_PROGRAM_MAX_FLOATS 64

/* MATMUL and CONV2D without an activation (their ints' default). */
#define TERN_ACTIVATION_NONE (-1)

/* Required-feature bits of an executable file (docs/executable-format.md).
 * The builder sets them from the instructions a file holds; a loader refuses
 * a file that needs a bit it does not know. Files without these
 * instructions have none and load in every tern 1.x. */
#define TERN_FEATURE_ELEMENTWISE_PROGRAMS (UINT64_C(1) << 0) /* ELEMENTWISE */
#define TERN_FEATURE_TENSOR_EPILOGUES \
  (UINT64_C(1) << 1)                            /* MATMUL/CONV2D with an activation or a residual */
#define TERN_FEATURE_SCAN (UINT64_C(1) << 2)    /* SCAN */
#define TERN_FEATURE_SORT (UINT64_C(1) << 3)    /* SORT, TOPK */
#define TERN_FEATURE_SCATTER (UINT64_C(1) << 4) /* SCATTER, SCATTER_ALONG_AXIS */
#define TERN_FEATURE_F64 (UINT64_C(1) << 5)     /* an f64 operand (TERN_DTYPE_F64) */

typedef enum tern_random_fn_t TERN_ENUM_BASE {
  TERN_RANDOM_UNIFORM = 0,   /* floats [low, high) */
  TERN_RANDOM_NORMAL = 1,    /* floats [mean, std] */
  TERN_RANDOM_BERNOULLI = 2, /* floats [p]: 1 with probability p */
  TERN_RANDOM_COUNT
} tern_random_fn_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_ISA_H_ */
