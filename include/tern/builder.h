/* tern — building executables.
 *
 * The builder assembles an executable in memory: constants, then functions
 * with their inputs, outputs and instructions; tern_builder_finish() produces
 * the container (docs/executable-format.md), ready for tern_executable_load()
 * or a file. Frameworks build small single-op executables at run time and
 * cache them by key; compilers build large ones. The builder checks what it
 * can as it goes, and the loader checks everything again.
 *
 * Builders need no device and no tern_init().
 */
#ifndef TERN_BUILDER_H_
#define TERN_BUILDER_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/isa.h"
#include "tern/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_builder_s* tern_builder_t;

/* An operand: a tensor in a segment. strides NULL means contiguous
 * (row-major); strides are in elements; stride 0 repeats (broadcast). */
typedef struct tern_operand_t {
  tern_segment_t segment;
  uint32_t index;  /* input or output index for those segments, else 0 */
  uint64_t offset; /* bytes from the start of the segment */
  tern_dtype_t dtype;
  uint32_t rank;          /* 0..TERN_MAX_RANK */
  const int64_t* shape;   /* rank entries */
  const int64_t* strides; /* rank entries, or NULL */
} tern_operand_t;

typedef struct tern_instruction_t {
  uint32_t struct_size; /* IN: sizeof(tern_instruction_t) */
  tern_opcode_t opcode;
  uint32_t core; /* core of a multi-core function, 0 otherwise */
  uint32_t operand_count;
  const tern_operand_t* operands;
  uint32_t int_count;
  uint32_t float_count;
  const int64_t* ints;
  const double* floats;
  /* The graph op this came from, for errors and traces ("aten::linear",
   * "model.layers.0.mlp"); NULL for none. Copied. */
  const char* debug_op;
} tern_instruction_t;

/* Creates an empty builder. `target` names the device kind the executable is
 * for; NULL means "trn2" (what the simulated device runs).
 * Thread-safety: any thread; a builder itself is used by one thread at a time. */
TERN_API tern_status_t tern_builder_create(const char* target, tern_builder_t* out_builder);

/* Flags of tern_builder_set_flags(). */
/* tern_builder_end_function() accepts a function whose engine streams race
 * (two instructions on different engines that no semaphore orders touch the
 * same bytes, at least one writing); without it such a function is refused
 * with both instructions named, as the loader would refuse it. For
 * experiments and for tests of the loader's check, never for production. */
#define TERN_BUILDER_ALLOW_RACES 0x1u

/* Sets the builder's flags (0 or TERN_BUILDER_ALLOW_RACES) for the functions
 * ended from now on. Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_set_flags(tern_builder_t builder, uint32_t flags);

/* Destroys a builder. Thread-safety: not with other calls on this builder. */
TERN_API tern_status_t tern_builder_destroy(tern_builder_t builder);

/* Appends `size` bytes of constants aligned to `alignment` and stores their
 * offset in the constants segment. `alignment` is 0 or a power of two up to
 * 4096; anything below 64 (0 included) means 64. `data` is copied.
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_add_constants(tern_builder_t builder, const void* data,
                                                  uint64_t size, uint64_t alignment,
                                                  uint64_t* out_offset);

/* Starts a function; stores its index. Until tern_builder_end_function(),
 * inputs, outputs and instructions go to it.
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_begin_function(tern_builder_t builder, const char* name,
                                                   uint32_t* out_function);

/* Declares the next input or output (contiguous tensors of dtype and shape)
 * of the current function; stores its index.
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_add_input(tern_builder_t builder, const char* name,
                                              tern_dtype_t dtype, uint32_t rank,
                                              const int64_t* shape, uint32_t* out_index);
TERN_API tern_status_t tern_builder_add_output(tern_builder_t builder, const char* name,
                                               tern_dtype_t dtype, uint32_t rank,
                                               const int64_t* shape, uint32_t* out_index);

/* Sets the scratch bytes each execution of the current function needs.
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_set_scratch(tern_builder_t builder, uint64_t bytes);

/* Appends an instruction to the current function, after checking it against
 * its opcode's rules (docs/isa.md) and its operands against the inputs,
 * outputs and constants declared so far. Sync instructions (TERN_OP_SEM_*)
 * take one more int here than in the file: the tern_engine_t of the stream
 * they order (isa.h). Nothing is added when the call fails.
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_add_instruction(tern_builder_t builder,
                                                    const tern_instruction_t* instruction);

/* Ends the current function, after checking that its engine streams cannot
 * deadlock on their semaphores and do not race (docs/executable-format.md,
 * "Synchronisation between engines"): either fails with
 * TERN_ERROR_INVALID_ARGUMENT naming the stuck waits or the racing pairs, and
 * the function stays open. Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_end_function(tern_builder_t builder);

/* Produces the executable; `*out_data` (free it with tern_builder_free_data)
 * holds `*out_size` bytes. The builder stays usable.
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_finish(tern_builder_t builder, void** out_data,
                                           uint64_t* out_size);

/* Produces the executable into the file at `path` (replaced atomically).
 * Thread-safety: not concurrently on one builder. */
TERN_API tern_status_t tern_builder_write_file(tern_builder_t builder, const char* path);

/* Frees data from tern_builder_finish(). Thread-safety: any thread. */
TERN_API void tern_builder_free_data(void* data);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_BUILDER_H_ */
