/* npy: the .npy reader and writer of the examples (see npy.h). */
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The header of a .npy file can be long (large structured dtypes); ours
 * are short, so anything above this is a damaged length field. */
#define NPY_MAX_HEADER (1u << 20)

static const unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* The NumPy type string of a dtype, NULL when NumPy has none. */
static const char* descr_of(tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return "<f4";
    case TERN_DTYPE_F16:
      return "<f2";
    case TERN_DTYPE_I8:
      return "|i1";
    case TERN_DTYPE_I32:
      return "<i4";
    case TERN_DTYPE_I64:
      return "<i8";
    case TERN_DTYPE_BOOL:
      return "|b1";
    default:
      return NULL;
  }
}

void npy_format_shape(uint32_t rank, const int64_t* shape, char* text, size_t text_size) {
  size_t used = 0;
  uint32_t i;
  if (text_size == 0) return;
  text[0] = '\0';
  used += (size_t)snprintf(text + used, text_size - used, "(");
  for (i = 0; i < rank && used < text_size; ++i) {
    used += (size_t)snprintf(text + used, text_size - used, "%s%lld", i > 0 ? ", " : "",
                             (long long)shape[i]);
  }
  if (used < text_size) snprintf(text + used, text_size - used, rank == 1 ? ",)" : ")");
}

static void set_error(char* error, size_t error_size, const char* format, ...) {
  va_list args;
  if (error == NULL || error_size == 0) return;
  va_start(args, format);
  vsnprintf(error, error_size, format, args);
  va_end(args);
}

void npy_free(npy_array* array) {
  if (array == NULL) return;
  free(array->data);
  memset(array, 0, sizeof(*array));
}

/* --- reading: a small parser for the header's dict literal ---------------- */

typedef struct parser {
  const char* text;
  size_t pos, size;
} parser;

static void skip_space(parser* p) {
  while (p->pos < p->size && (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' ||
                              p->text[p->pos] == '\n' || p->text[p->pos] == '\r')) {
    ++p->pos;
  }
}

static int accept(parser* p, char c) {
  skip_space(p);
  if (p->pos < p->size && p->text[p->pos] == c) {
    ++p->pos;
    return 1;
  }
  return 0;
}

/* A Python string literal in single or double quotes, without escapes
 * (NumPy never writes any in these headers). */
static int parse_string(parser* p, char* out, size_t out_size) {
  char quote;
  size_t length = 0;
  skip_space(p);
  if (p->pos >= p->size || (p->text[p->pos] != '\'' && p->text[p->pos] != '"')) return 0;
  quote = p->text[p->pos++];
  while (p->pos < p->size && p->text[p->pos] != quote) {
    if (p->text[p->pos] == '\\' || length + 1 >= out_size) return 0;
    out[length++] = p->text[p->pos++];
  }
  if (p->pos >= p->size) return 0;
  ++p->pos; /* the closing quote */
  out[length] = '\0';
  return 1;
}

static int parse_word(parser* p, const char* word) {
  const size_t length = strlen(word);
  skip_space(p);
  if (p->size - p->pos >= length && memcmp(p->text + p->pos, word, length) == 0) {
    p->pos += length;
    return 1;
  }
  return 0;
}

/* A tuple of non-negative integers: "()", "(5,)", "(8, 64)". */
static int parse_shape(parser* p, uint32_t* rank, int64_t* shape, char* why, size_t why_size) {
  *rank = 0;
  if (!accept(p, '(')) {
    set_error(why, why_size, "'shape' is not a tuple");
    return 0;
  }
  if (accept(p, ')')) return 1;
  for (;;) {
    int64_t value = 0;
    int digits = 0;
    skip_space(p);
    while (p->pos < p->size && p->text[p->pos] >= '0' && p->text[p->pos] <= '9') {
      const int digit = p->text[p->pos++] - '0';
      if (value > (INT64_MAX - digit) / 10) {
        set_error(why, why_size, "a dimension of 'shape' does not fit in 64 bits");
        return 0;
      }
      value = value * 10 + digit;
      ++digits;
    }
    /* Python 2 era files may write 64L. */
    if (digits > 0 && p->pos < p->size && p->text[p->pos] == 'L') ++p->pos;
    if (digits == 0) {
      set_error(why, why_size, "'shape' holds something other than non-negative integers");
      return 0;
    }
    if (*rank == TERN_MAX_RANK) {
      set_error(why, why_size, "'shape' has more than %d dimensions, tern's maximum rank",
                TERN_MAX_RANK);
      return 0;
    }
    shape[(*rank)++] = value;
    if (accept(p, ')')) return 1;
    if (!accept(p, ',')) {
      set_error(why, why_size, "'shape' is not a well-formed tuple");
      return 0;
    }
    if (accept(p, ')')) return 1;
  }
}

/* Maps a NumPy type string to a tern dtype; 0 with a reason otherwise. */
static int dtype_of_descr(const char* descr, tern_dtype_t* out, char* why, size_t why_size) {
  static const struct {
    const char* descr;
    tern_dtype_t dtype;
  } kTable[] = {{"<f4", TERN_DTYPE_F32},  {"<f2", TERN_DTYPE_F16}, {"|i1", TERN_DTYPE_I8},
                {"<i1", TERN_DTYPE_I8},   {"<i4", TERN_DTYPE_I32}, {"<i8", TERN_DTYPE_I64},
                {"|b1", TERN_DTYPE_BOOL}, {"<b1", TERN_DTYPE_BOOL}};
  size_t i;
  for (i = 0; i < sizeof(kTable) / sizeof(kTable[0]); ++i) {
    if (strcmp(descr, kTable[i].descr) == 0) {
      *out = kTable[i].dtype;
      return 1;
    }
  }
  if (descr[0] == '>') {
    set_error(why, why_size,
              "its elements are big-endian ('%s'); save a little-endian copy "
              "(arr.astype(arr.dtype.newbyteorder('<')))",
              descr);
  } else {
    set_error(why, why_size,
              "its dtype '%s' is not one tern runs; use float32 ('<f4'), float16 ('<f2'), "
              "int8, int32, int64 or bool",
              descr);
  }
  return 0;
}

/* Parses the header dict into dtype, rank and shape. */
static int parse_header(const char* text, size_t size, npy_array* out, char* why, size_t why_size) {
  parser p;
  int have_descr = 0, have_order = 0, have_shape = 0;
  char key[32];
  char descr[64];
  p.text = text;
  p.pos = 0;
  p.size = size;
  if (!accept(&p, '{')) {
    set_error(why, why_size, "the header is not a Python dict literal");
    return 0;
  }
  while (!accept(&p, '}')) {
    if (!parse_string(&p, key, sizeof(key)) || !accept(&p, ':')) {
      set_error(why, why_size, "the header dict is malformed near byte %zu", p.pos);
      return 0;
    }
    if (strcmp(key, "descr") == 0) {
      if (!parse_string(&p, descr, sizeof(descr))) {
        set_error(why, why_size,
                  "'descr' is not a simple type string (a structured dtype?); save a plain "
                  "numeric array");
        return 0;
      }
      if (!dtype_of_descr(descr, &out->dtype, why, why_size)) return 0;
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (parse_word(&p, "True")) {
        set_error(why, why_size,
                  "it is in Fortran (column-major) order; save np.ascontiguousarray(arr) "
                  "instead");
        return 0;
      }
      if (!parse_word(&p, "False")) {
        set_error(why, why_size, "'fortran_order' is neither True nor False");
        return 0;
      }
      have_order = 1;
    } else if (strcmp(key, "shape") == 0) {
      if (!parse_shape(&p, &out->rank, out->shape, why, why_size)) return 0;
      have_shape = 1;
    } else {
      set_error(why, why_size, "the header has an unexpected key '%s'", key);
      return 0;
    }
    if (!accept(&p, ',')) {
      if (!accept(&p, '}')) {
        set_error(why, why_size, "the header dict is malformed near byte %zu", p.pos);
        return 0;
      }
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) {
    set_error(why, why_size, "the header lacks '%s'",
              !have_descr   ? "descr"
              : !have_order ? "fortran_order"
                            : "shape");
    return 0;
  }
  skip_space(&p);
  if (p.pos != p.size) {
    set_error(why, why_size, "the header has text after its dict");
    return 0;
  }
  return 1;
}

static uint64_t read_le(const unsigned char* bytes, int count) {
  uint64_t value = 0;
  int i;
  for (i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

int npy_read(const char* path, npy_array* out, char* error, size_t error_size) {
  FILE* file;
  unsigned char preamble[12];
  char* header = NULL;
  size_t header_offset, header_length, element;
  long end;
  uint64_t data_bytes, available;
  uint32_t i;
  char why[256];
  int ok = 0;

  memset(out, 0, sizeof(*out));
  why[0] = '\0';
  file = fopen(path, "rb");
  if (file == NULL) {
    set_error(error, error_size, "%s: cannot open it: %s", path, strerror(errno));
    return 0;
  }
  if (fread(preamble, 1, 10, file) != 10 || memcmp(preamble, kMagic, 6) != 0) {
    set_error(why, sizeof(why),
              "it does not start with the .npy magic string (\\x93NUMPY): not a .npy file "
              "(write it with numpy.save)");
    goto out;
  }
  if (preamble[6] == 1) {
    header_offset = 10;
    header_length = (size_t)read_le(preamble + 8, 2);
  } else if (preamble[6] == 2 || preamble[6] == 3) {
    if (fread(preamble + 10, 1, 2, file) != 2) {
      set_error(why, sizeof(why), "it is truncated inside its preamble");
      goto out;
    }
    header_offset = 12;
    header_length = (size_t)read_le(preamble + 8, 4);
  } else {
    set_error(why, sizeof(why), "its format version is %d.%d; this reader knows 1.0 to 3.0",
              preamble[6], preamble[7]);
    goto out;
  }
  if (header_length == 0 || header_length > NPY_MAX_HEADER) {
    set_error(why, sizeof(why), "its header length %zu is not plausible", header_length);
    goto out;
  }
  header = malloc(header_length);
  if (header == NULL) {
    set_error(why, sizeof(why), "cannot allocate %zu bytes for its header", header_length);
    goto out;
  }
  if (fread(header, 1, header_length, file) != header_length) {
    set_error(why, sizeof(why), "it is truncated inside its %zu-byte header", header_length);
    goto out;
  }
  if (!parse_header(header, header_length, out, why, sizeof(why))) goto out;

  element = (size_t)tern_dtype_size(out->dtype);
  out->count = 1;
  for (i = 0; i < out->rank; ++i) {
    if (out->shape[i] != 0 && out->count > UINT64_MAX / (uint64_t)out->shape[i]) {
      set_error(why, sizeof(why), "its shape has more elements than 64 bits can count");
      goto out;
    }
    out->count *= (uint64_t)out->shape[i];
  }
  if (out->count > UINT64_MAX / element) {
    set_error(why, sizeof(why), "its data size overflows 64 bits");
    goto out;
  }
  data_bytes = out->count * element;
  if (fseek(file, 0, SEEK_END) != 0 || (end = ftell(file)) < 0) {
    set_error(why, sizeof(why), "cannot find its size: %s", strerror(errno));
    goto out;
  }
  available = (uint64_t)end - (uint64_t)(header_offset + header_length);
  if ((uint64_t)end < header_offset + header_length) available = 0;
  if (available != data_bytes) {
    char shape[160];
    npy_format_shape(out->rank, out->shape, shape, sizeof(shape));
    set_error(why, sizeof(why), "shape %s of %s needs %llu bytes of data but the file has %llu%s",
              shape, tern_dtype_name(out->dtype), (unsigned long long)data_bytes,
              (unsigned long long)available,
              available < data_bytes ? " (truncated: copy or save it again)"
                                     : " (extra bytes after the array: one array per file)");
    goto out;
  }
  if (data_bytes > (uint64_t)(size_t)-1 ||
      fseek(file, (long)(header_offset + header_length), SEEK_SET) != 0) {
    set_error(why, sizeof(why), "cannot seek to its data");
    goto out;
  }
  out->data = malloc(data_bytes > 0 ? (size_t)data_bytes : 1);
  if (out->data == NULL) {
    set_error(why, sizeof(why), "cannot allocate %llu bytes for its data",
              (unsigned long long)data_bytes);
    goto out;
  }
  if (data_bytes > 0 && fread(out->data, 1, (size_t)data_bytes, file) != (size_t)data_bytes) {
    set_error(why, sizeof(why), "reading its data failed");
    goto out;
  }
  if (out->dtype == TERN_DTYPE_BOOL) {
    /* NumPy writes 0 and 1; anything else is a damaged file. */
    const unsigned char* bytes = out->data;
    uint64_t k;
    for (k = 0; k < out->count; ++k) {
      if (bytes[k] > 1) {
        set_error(why, sizeof(why), "bool element %llu is %u, not 0 or 1", (unsigned long long)k,
                  bytes[k]);
        goto out;
      }
    }
  }
  ok = 1;
out:
  fclose(file);
  free(header);
  if (!ok) {
    npy_free(out);
    set_error(error, error_size, "%s: %s", path, why);
  }
  return ok;
}

/* --- writing --------------------------------------------------------------- */

int npy_write(const char* path, tern_dtype_t dtype, uint32_t rank, const int64_t* shape,
              const void* data, char* error, size_t error_size) {
  const char* descr = descr_of(dtype);
  char shape_text[200];
  char header[512];
  unsigned char preamble[10];
  size_t length, padded;
  uint64_t count = 1, bytes;
  uint32_t i;
  FILE* file;
  int ok;

  if (descr == NULL) {
    set_error(error, error_size, "%s: NumPy has no %s dtype; convert the tensor to f32 first", path,
              tern_dtype_name(dtype));
    return 0;
  }
  if (rank > TERN_MAX_RANK) {
    set_error(error, error_size, "%s: rank %u exceeds %d", path, rank, TERN_MAX_RANK);
    return 0;
  }
  for (i = 0; i < rank; ++i) count *= (uint64_t)shape[i];
  bytes = count * (size_t)tern_dtype_size(dtype);
  npy_format_shape(rank, shape, shape_text, sizeof(shape_text));
  length =
      (size_t)snprintf(header, sizeof(header),
                       "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape_text);
  /* Spaces, then a newline, so that the data starts at a multiple of 64. */
  padded = (10 + length + 1 + 63) / 64 * 64 - 10;
  if (padded >= sizeof(header)) {
    set_error(error, error_size, "%s: the header would be too long", path);
    return 0;
  }
  memset(header + length, ' ', padded - length - 1);
  header[padded - 1] = '\n';
  memcpy(preamble, kMagic, 6);
  preamble[6] = 1;
  preamble[7] = 0;
  preamble[8] = (unsigned char)(padded & 0xff);
  preamble[9] = (unsigned char)(padded >> 8);

  file = fopen(path, "wb");
  if (file == NULL) {
    set_error(error, error_size, "%s: cannot create it: %s", path, strerror(errno));
    return 0;
  }
  ok = fwrite(preamble, 1, 10, file) == 10 && fwrite(header, 1, padded, file) == padded &&
       (bytes == 0 || fwrite(data, 1, (size_t)bytes, file) == (size_t)bytes);
  if (fclose(file) != 0) ok = 0;
  if (!ok) set_error(error, error_size, "%s: writing it failed: %s", path, strerror(errno));
  return ok;
}
