/* npy: read and write NumPy .npy files (format versions 1.0, 2.0 and 3.0),
 * for the examples that exchange tensors with Python.
 *
 * A .npy file is a magic string, a version, a little-endian header length,
 * an ASCII header that is a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (8, 64), }
 * padded with spaces and a newline to a multiple of 64 bytes, then the raw
 * elements in C (row-major) order. np.save() writes exactly this; np.load()
 * reads what npy_write() writes.
 *
 * Supported element types, mapped to tern dtypes: '<f4' f32, '<f2' f16,
 * '|i1' i8, '<i4' i32, '<i8' i64, '|b1' bool. bf16 has no NumPy dtype; the
 * examples write bf16 tensors as f32 (exact) and read f32 files into bf16
 * inputs (rounded to nearest even). Everything else (big-endian data,
 * Fortran order, object arrays, structured dtypes, files cut short or with
 * bytes after the data) is rejected with a message that says what was found
 * and what to do about it.
 */
#ifndef TERN_EXAMPLES_NPY_H_
#define TERN_EXAMPLES_NPY_H_

#include <stddef.h>
#include <stdint.h>
#include <tern/isa.h>

typedef struct npy_array {
  tern_dtype_t dtype;
  uint32_t rank;
  int64_t shape[TERN_MAX_RANK];
  uint64_t count; /* elements: the product of shape (1 for rank 0) */
  void* data;     /* count elements of dtype, malloc'ed; free with npy_free() */
} npy_array;

/* Reads the array in `path` into `*out`. Returns 1 on success; on failure
 * returns 0, leaves `*out` empty and writes a one-line message, which names
 * the file, into `error` (`error_size` bytes). */
int npy_read(const char* path, npy_array* out, char* error, size_t error_size);

/* Writes `data` (the elements of a C-order array of `dtype` and `shape`) to
 * `path` in format 1.0. Returns 1 on success, 0 with a message otherwise.
 * bf16 cannot be written (convert to f32 first). */
int npy_write(const char* path, tern_dtype_t dtype, uint32_t rank, const int64_t* shape,
              const void* data, char* error, size_t error_size);

/* Frees the data of `array` and empties it; safe on an empty array. */
void npy_free(npy_array* array);

/* Formats a shape as NumPy prints it: "(8, 64)", "(5,)", "()". */
void npy_format_shape(uint32_t rank, const int64_t* shape, char* text, size_t text_size);

#endif /* TERN_EXAMPLES_NPY_H_ */
