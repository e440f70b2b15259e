/* run_model: load an executable file, feed it .npy inputs, run it, write
 * its outputs as .npy files, and optionally check them against references.
 *
 *   ./run_model MODEL.tern [options] [INPUT.npy | NAME=INPUT.npy]...
 *
 * Inputs are matched to the function's inputs by position (the n-th
 * unnamed file is the n-th input not named elsewhere) or by name
 * ("x=batch.npy"). Each file must hold exactly the input's dtype and shape,
 * as the executable's signature declares them (tern dump MODEL.tern shows
 * it); bf16 inputs are read from f32 files and rounded to nearest even.
 *
 * Options:
 *   --function NAME      the function to run (default: the only one)
 *   --output-dir DIR     write each output to DIR/NAME.npy (default: .)
 *   --no-output          do not write the outputs
 *   --expect [NAME=]REF.npy
 *                        compare an output (by position or name) with a
 *                        reference: |out - ref| <= atol + rtol * |ref|
 *   --rtol R, --atol A   the tolerances (default 1e-4 and 1e-5)
 *   --repeat N           run N times and print the best time (default 1)
 *   --device D           the device to run on (default 0; core 0)
 *
 * It prints how long loading (validation included) and each run took.
 * Exit status: 0 on success, 1 when a tern call failed (the message says
 * which and why), 2 when an output does not match its reference, 3 on a bad
 * command line or a bad input file (the message says what is wrong).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tern/tern.h>
#include <time.h>

#include "npy.h"

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_MISMATCH = 2, EXIT_BAD_INPUT = 3 };

#define MAX_TENSORS 64

static int failed(tern_status_t status, const char* what) {
  const char* name;
  const char* message;
  if (status == TERN_OK) return 0;
  name = tern_status_string(status);
  message = tern_last_error_message();
  fprintf(stderr, "run_model: %s failed with %s\n  %s\n", what, name, message);
  return 1;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A file given on the command line for an input or a reference: `name` is
 * NULL when it goes by position. */
typedef struct file_arg {
  const char* name;
  const char* path;
} file_arg;

/* Splits "NAME=PATH" (a name is letters, digits, '_', '.', ':', '/'... up
 * to the first '='; a path that itself contains '=' can be given as
 * "=PATH" to force position). */
static file_arg parse_file_arg(char* text) {
  file_arg arg;
  char* equals = strchr(text, '=');
  arg.name = NULL;
  arg.path = text;
  if (equals != NULL) {
    *equals = '\0';
    arg.name = text[0] != '\0' ? text : NULL;
    arg.path = equals + 1;
  }
  return arg;
}

/* One input or output of the function, and what is bound to it. */
typedef struct slot {
  tern_tensor_info_t info;
  const char* path; /* the file given for it, NULL if none */
  tern_buffer_t buffer;
} slot;

/* Matches files to slots: named ones by name, then unnamed ones in order to
 * the slots still free. Returns 0 after printing what is wrong. */
static int assign_files(const file_arg* files, int file_count, slot* slots, uint32_t slot_count,
                        const char* what, int all_required) {
  int f;
  uint32_t s;
  for (f = 0; f < file_count; ++f) {
    if (files[f].name == NULL) continue;
    for (s = 0; s < slot_count; ++s) {
      if (strcmp(slots[s].info.name, files[f].name) == 0) break;
    }
    if (s == slot_count) {
      fprintf(stderr, "run_model: the function has no %s named '%s'; its %ss are:", what,
              files[f].name, what);
      for (s = 0; s < slot_count; ++s) fprintf(stderr, " '%s'", slots[s].info.name);
      fprintf(stderr, "%s\n", slot_count == 0 ? " (none)" : "");
      return 0;
    }
    if (slots[s].path != NULL) {
      fprintf(stderr, "run_model: %s '%s' is given twice ('%s' and '%s')\n", what,
              slots[s].info.name, slots[s].path, files[f].path);
      return 0;
    }
    slots[s].path = files[f].path;
  }
  s = 0;
  for (f = 0; f < file_count; ++f) {
    if (files[f].name != NULL) continue;
    while (s < slot_count && slots[s].path != NULL) ++s;
    if (s == slot_count) {
      fprintf(stderr,
              "run_model: too many %s files: the function has %u %s(s), all given already, and "
              "'%s' is one more\n",
              what, slot_count, what, files[f].path);
      return 0;
    }
    slots[s].path = files[f].path;
  }
  if (all_required) {
    for (s = 0; s < slot_count; ++s) {
      if (slots[s].path == NULL) {
        fprintf(stderr,
                "run_model: no file for %s %u '%s'; give one by position or as %s=FILE.npy\n", what,
                s, slots[s].info.name, slots[s].info.name);
        return 0;
      }
    }
  }
  return 1;
}

/* "f32 [16, 256]" */
static void describe(const tern_tensor_info_t* info, char* text, size_t size) {
  size_t used = (size_t)snprintf(text, size, "%s [", tern_dtype_name(info->dtype));
  uint32_t i;
  for (i = 0; i < info->rank && used < size; ++i) {
    used += (size_t)snprintf(text + used, size - used, "%s%lld", i ? ", " : "",
                             (long long)info->shape[i]);
  }
  if (used < size) snprintf(text + used, size - used, "]");
}

/* f32 to bf16, rounding to nearest even (NaN stays NaN). */
static uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t value) {
  const uint32_t bits = (uint32_t)value << 16;
  float out;
  memcpy(&out, &bits, 4);
  return out;
}

/* Reads the file for an input, checks it against the signature and copies
 * it to the device. Returns an exit code. */
static int load_input(tern_device_t device, slot* input, uint32_t index, const char* function) {
  npy_array array;
  char error[512], expected[160], found[160];
  uint32_t i;
  int shape_ok;
  void* data;
  uint16_t* converted = NULL;
  tern_buffer_params_t params;
  int code = EXIT_BAD_INPUT;

  if (!npy_read(input->path, &array, error, sizeof(error))) {
    fprintf(stderr, "run_model: input %u '%s': %s\n", index, input->info.name, error);
    return EXIT_BAD_INPUT;
  }
  describe(&input->info, expected, sizeof(expected));
  npy_format_shape(array.rank, array.shape, found, sizeof(found));
  shape_ok = array.rank == input->info.rank;
  for (i = 0; shape_ok && i < array.rank; ++i) shape_ok = array.shape[i] == input->info.shape[i];
  if (array.dtype != input->info.dtype &&
      !(input->info.dtype == TERN_DTYPE_BF16 && array.dtype == TERN_DTYPE_F32)) {
    fprintf(stderr,
            "run_model: %s holds %s data, but input %u '%s' of function '%s' is %s; save the "
            "array with that dtype\n",
            input->path, tern_dtype_name(array.dtype), index, input->info.name, function, expected);
    goto out;
  }
  if (!shape_ok) {
    fprintf(stderr,
            "run_model: %s has shape %s, but input %u '%s' of function '%s' is %s; reshape the "
            "array to match\n",
            input->path, found, index, input->info.name, function, expected);
    goto out;
  }
  data = array.data;
  if (input->info.dtype == TERN_DTYPE_BF16) {
    uint64_t k;
    converted = malloc(array.count > 0 ? (size_t)array.count * 2 : 1);
    if (converted == NULL) {
      fprintf(stderr, "run_model: out of host memory\n");
      goto out;
    }
    for (k = 0; k < array.count; ++k) converted[k] = f32_to_bf16(((const float*)array.data)[k]);
    data = converted;
  }
  code = EXIT_TERN_FAILED;
  if (input->info.size_bytes > 0) {
    memset(&params, 0, sizeof(params));
    params.struct_size = sizeof(params);
    params.size = input->info.size_bytes;
    params.category = TERN_MEMORY_TENSORS;
    if (failed(tern_buffer_alloc(device, &params, &input->buffer), "tern_buffer_alloc") ||
        failed(tern_buffer_write(input->buffer, 0, data, input->info.size_bytes),
               "tern_buffer_write")) {
      goto out;
    }
  }
  code = EXIT_OK;
out:
  free(converted);
  npy_free(&array);
  return code;
}

/* Copies an output back, as f32 when it is bf16 (NumPy has no bf16).
 * `*out_data` is malloc'ed. */
static int read_output(const slot* output, tern_dtype_t* out_dtype, void** out_data) {
  const uint64_t bytes = output->info.size_bytes;
  uint64_t count, k;
  void* data = malloc(bytes > 0 ? (size_t)bytes : 1);
  *out_data = NULL;
  if (data == NULL) {
    fprintf(stderr, "run_model: out of host memory\n");
    return 0;
  }
  if (bytes > 0 && failed(tern_buffer_read(output->buffer, 0, data, bytes), "tern_buffer_read")) {
    free(data);
    return 0;
  }
  *out_dtype = output->info.dtype;
  if (output->info.dtype == TERN_DTYPE_BF16) {
    float* widened;
    count = bytes / 2;
    widened = malloc(count > 0 ? (size_t)count * 4 : 1);
    if (widened == NULL) {
      free(data);
      fprintf(stderr, "run_model: out of host memory\n");
      return 0;
    }
    for (k = 0; k < count; ++k) widened[k] = bf16_to_f32(((const uint16_t*)data)[k]);
    free(data);
    data = widened;
    *out_dtype = TERN_DTYPE_F32;
  }
  *out_data = data;
  return 1;
}

static double element_as_double(tern_dtype_t dtype, const void* data, uint64_t k) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return ((const float*)data)[k];
    case TERN_DTYPE_F16: {
      /* IEEE binary16 by hand: C99 has no half type. */
      const uint16_t h = ((const uint16_t*)data)[k];
      const int exponent = (h >> 10) & 0x1f;
      const double mantissa = (double)(h & 0x3ff);
      double value = exponent == 0    ? ldexp(mantissa, -24)
                     : exponent == 31 ? (mantissa != 0 ? NAN : INFINITY)
                                      : ldexp(mantissa + 1024.0, exponent - 25);
      return (h & 0x8000) ? -value : value;
    }
    case TERN_DTYPE_I8:
      return ((const int8_t*)data)[k];
    case TERN_DTYPE_I32:
      return ((const int32_t*)data)[k];
    case TERN_DTYPE_I64:
      return (double)((const int64_t*)data)[k];
    case TERN_DTYPE_BOOL:
      return ((const uint8_t*)data)[k] != 0;
    default:
      return NAN;
  }
}

/* Compares an output with its reference file. Returns an exit code. */
static int check_output(const slot* output, tern_dtype_t dtype, const void* data,
                        const char* reference, double rtol, double atol) {
  npy_array ref;
  char error[512], found[160], expected[160];
  uint64_t k, count, mismatches = 0, first = 0;
  double worst_abs = 0, worst_rel = 0;
  uint32_t i;
  int shape_ok;
  if (!npy_read(reference, &ref, error, sizeof(error))) {
    fprintf(stderr, "run_model: reference for output '%s': %s\n", output->info.name, error);
    return EXIT_BAD_INPUT;
  }
  shape_ok = ref.rank == output->info.rank;
  for (i = 0; shape_ok && i < ref.rank; ++i) shape_ok = ref.shape[i] == output->info.shape[i];
  if (!shape_ok) {
    npy_format_shape(ref.rank, ref.shape, found, sizeof(found));
    describe(&output->info, expected, sizeof(expected));
    fprintf(stderr, "run_model: reference %s has shape %s, but output '%s' is %s\n", reference,
            found, output->info.name, expected);
    npy_free(&ref);
    return EXIT_BAD_INPUT;
  }
  count = ref.count;
  for (k = 0; k < count; ++k) {
    const double got = element_as_double(dtype, data, k);
    const double want = element_as_double(ref.dtype, ref.data, k);
    const double diff = fabs(got - want);
    int ok = diff <= atol + rtol * fabs(want) || (isnan(got) && isnan(want)) || got == want;
    if (!isnan(diff)) {
      if (diff > worst_abs) worst_abs = diff;
      if (want != 0 && diff / fabs(want) > worst_rel) worst_rel = diff / fabs(want);
    }
    if (!ok && mismatches++ == 0) first = k;
  }
  if (mismatches > 0) {
    fprintf(stderr,
            "run_model: output '%s' differs from %s in %llu of %llu elements (rtol %g, atol "
            "%g); the first is element %llu: %.9g, expected %.9g; max abs error %.3g\n",
            output->info.name, reference, (unsigned long long)mismatches, (unsigned long long)count,
            rtol, atol, (unsigned long long)first, element_as_double(dtype, data, first),
            element_as_double(ref.dtype, ref.data, first), worst_abs);
  } else {
    printf("output '%s' matches %s: %llu elements, max abs error %.3g, max rel error %.3g\n",
           output->info.name, reference, (unsigned long long)count, worst_abs, worst_rel);
  }
  npy_free(&ref);
  return mismatches > 0 ? EXIT_MISMATCH : EXIT_OK;
}

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s MODEL.tern [--function NAME] [--output-dir DIR | --no-output]\n"
          "          [--expect [NAME=]REF.npy]... [--rtol R] [--atol A] [--repeat N]\n"
          "          [--device D] [INPUT.npy | NAME=INPUT.npy]...\n"
          "Runs a function of an executable on .npy inputs and writes its outputs as .npy\n"
          "files; with --expect, checks them against references.\n",
          argv0);
}

static int parse_number(const char* flag, const char* text, double min, double max, double* out) {
  char* end;
  const double value = strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= min && value <= max)) {
    fprintf(stderr, "run_model: %s takes a number from %g to %g, not '%s'\n", flag, min, max, text);
    return 0;
  }
  *out = value;
  return 1;
}

int main(int argc, char** argv) {
  const char* model_path = NULL;
  const char* function_name = NULL;
  const char* output_dir = ".";
  int write_outputs = 1;
  double rtol = 1e-4, atol = 1e-5, repeat = 1, device_index = 0;
  file_arg inputs_given[MAX_TENSORS], expects_given[MAX_TENSORS];
  int input_file_count = 0, expect_count = 0;
  slot inputs[MAX_TENSORS], outputs[MAX_TENSORS];
  tern_binding_t input_bindings[MAX_TENSORS], output_bindings[MAX_TENSORS];
  tern_device_t device = NULL;
  tern_core_t core = NULL;
  tern_queue_t queue = NULL;
  tern_executable_t executable = NULL;
  tern_function_info_t info;
  uint32_t function = 0, count = 0, i;
  double start, load_seconds, first_seconds = 0, best_seconds = 0;
  int arg, run, code, exit_code = EXIT_BAD_INPUT;

  memset(inputs, 0, sizeof(inputs));
  memset(outputs, 0, sizeof(outputs));
  memset(&info, 0, sizeof(info));
  for (arg = 1; arg < argc; ++arg) {
    const char* flag = argv[arg];
    const int has_value = arg + 1 < argc;
    if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
      usage(argv[0]);
      return EXIT_OK;
    }
    if (strcmp(flag, "--no-output") == 0) {
      write_outputs = 0;
      continue;
    }
    if (flag[0] == '-' && flag[1] != '\0') {
      static const char* const kValued[] = {"--function", "--output-dir", "--expect", "--rtol",
                                            "--atol",     "--repeat",     "--device"};
      size_t known = 0;
      while (known < sizeof(kValued) / sizeof(kValued[0]) && strcmp(flag, kValued[known]) != 0) {
        ++known;
      }
      if (known == sizeof(kValued) / sizeof(kValued[0])) {
        fprintf(stderr, "run_model: unknown option '%s'\n", flag);
        usage(argv[0]);
        return EXIT_BAD_INPUT;
      }
      if (!has_value) {
        fprintf(stderr, "run_model: %s needs a value\n", flag);
        return EXIT_BAD_INPUT;
      }
      ++arg;
      if (strcmp(flag, "--function") == 0) {
        function_name = argv[arg];
      } else if (strcmp(flag, "--output-dir") == 0) {
        output_dir = argv[arg];
      } else if (strcmp(flag, "--expect") == 0) {
        if (expect_count == MAX_TENSORS) {
          fprintf(stderr, "run_model: at most %d --expect\n", MAX_TENSORS);
          return EXIT_BAD_INPUT;
        }
        expects_given[expect_count++] = parse_file_arg(argv[arg]);
      } else if (strcmp(flag, "--rtol") == 0) {
        if (!parse_number(flag, argv[arg], 0, 1e30, &rtol)) return EXIT_BAD_INPUT;
      } else if (strcmp(flag, "--atol") == 0) {
        if (!parse_number(flag, argv[arg], 0, 1e30, &atol)) return EXIT_BAD_INPUT;
      } else if (strcmp(flag, "--repeat") == 0) {
        if (!parse_number(flag, argv[arg], 1, 1e6, &repeat)) return EXIT_BAD_INPUT;
      } else {
        if (!parse_number(flag, argv[arg], 0, 1023, &device_index)) return EXIT_BAD_INPUT;
      }
      continue;
    }
    if (model_path == NULL) {
      model_path = flag;
      continue;
    }
    if (input_file_count == MAX_TENSORS) {
      fprintf(stderr, "run_model: at most %d inputs\n", MAX_TENSORS);
      return EXIT_BAD_INPUT;
    }
    inputs_given[input_file_count++] = parse_file_arg(argv[arg]);
  }
  if (model_path == NULL) {
    usage(argv[0]);
    return EXIT_BAD_INPUT;
  }

  if (failed(tern_init(NULL), "tern_init")) return EXIT_TERN_FAILED;
  exit_code = EXIT_TERN_FAILED;
  if (failed(tern_device_get((uint32_t)device_index, &device), "tern_device_get") ||
      failed(tern_core_open(device, 0, &core), "tern_core_open(core 0)") ||
      failed(tern_queue_create(core, NULL, &queue), "tern_queue_create")) {
    goto out;
  }

  /* Load: the file is validated once, here; its constants are mapped from
   * the file, not copied. */
  start = now_seconds();
  if (failed(tern_executable_load_file(device, model_path, NULL, &executable),
             "tern_executable_load_file")) {
    goto out;
  }
  load_seconds = now_seconds() - start;

  if (function_name != NULL) {
    if (failed(tern_executable_find_function(executable, function_name, &function),
               "tern_executable_find_function")) {
      goto out;
    }
  } else {
    if (failed(tern_executable_function_count(executable, &count),
               "tern_executable_function_count")) {
      goto out;
    }
    if (count != 1) {
      fprintf(stderr, "run_model: %s has %u functions; choose one with --function NAME\n",
              model_path, count);
      exit_code = EXIT_BAD_INPUT;
      goto out;
    }
  }
  info.struct_size = sizeof(info);
  if (failed(tern_executable_function_info(executable, function, &info),
             "tern_executable_function_info")) {
    goto out;
  }
  if (info.input_count > MAX_TENSORS || info.output_count > MAX_TENSORS) {
    fprintf(stderr, "run_model: function '%s' has more than %d inputs or outputs\n", info.name,
            MAX_TENSORS);
    goto out;
  }
  for (i = 0; i < info.input_count + info.output_count; ++i) {
    const int is_output = i >= info.input_count;
    slot* s = is_output ? &outputs[i - info.input_count] : &inputs[i];
    s->info.struct_size = sizeof(s->info);
    if (failed(tern_executable_tensor_info(executable, function, is_output,
                                           is_output ? i - info.input_count : i, &s->info),
               "tern_executable_tensor_info")) {
      goto out;
    }
  }
  printf("loaded %s in %.3f ms: function '%s', %u inputs, %u outputs, %u instructions\n",
         model_path, load_seconds * 1e3, info.name, info.input_count, info.output_count,
         info.instruction_count);

  /* Inputs: read, checked against the signature, copied to the device. */
  exit_code = EXIT_BAD_INPUT;
  if (!assign_files(inputs_given, input_file_count, inputs, info.input_count, "input", 1) ||
      !assign_files(expects_given, expect_count, outputs, info.output_count, "output", 0)) {
    goto out;
  }
  for (i = 0; i < info.input_count; ++i) {
    code = load_input(device, &inputs[i], i, info.name);
    if (code != EXIT_OK) {
      exit_code = code;
      goto out;
    }
    input_bindings[i].buffer = inputs[i].buffer;
    input_bindings[i].offset = 0;
  }
  exit_code = EXIT_TERN_FAILED;
  for (i = 0; i < info.output_count; ++i) {
    tern_buffer_params_t params;
    if (outputs[i].info.size_bytes > 0) {
      memset(&params, 0, sizeof(params));
      params.struct_size = sizeof(params);
      params.size = outputs[i].info.size_bytes;
      params.category = TERN_MEMORY_TENSORS;
      if (failed(tern_buffer_alloc(device, &params, &outputs[i].buffer), "tern_buffer_alloc")) {
        goto out;
      }
    }
    output_bindings[i].buffer = outputs[i].buffer;
    output_bindings[i].offset = 0;
  }

  /* Run: submit and wait, timed on the host (the first run also pays for
   * first-touch page faults and primitive creation in the engines). */
  for (run = 0; run < (int)repeat; ++run) {
    double seconds;
    start = now_seconds();
    if (failed(tern_queue_execute(queue, executable, function, input_bindings, info.input_count,
                                  output_bindings, info.output_count, NULL),
               "tern_queue_execute") ||
        failed(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize")) {
      goto out;
    }
    seconds = now_seconds() - start;
    if (run == 0) first_seconds = best_seconds = seconds;
    if (seconds < best_seconds) best_seconds = seconds;
  }
  if (repeat > 1) {
    printf("ran '%s' %d times: first %.3f ms, best %.3f ms\n", info.name, (int)repeat,
           first_seconds * 1e3, best_seconds * 1e3);
  } else {
    printf("ran '%s' in %.3f ms\n", info.name, first_seconds * 1e3);
  }

  /* Outputs: checked against their references, then written. */
  exit_code = EXIT_OK;
  for (i = 0; i < info.output_count; ++i) {
    tern_dtype_t dtype;
    void* data;
    char path[4096], error[512], shape[160];
    if (!read_output(&outputs[i], &dtype, &data)) {
      exit_code = EXIT_TERN_FAILED;
      goto out;
    }
    if (outputs[i].path != NULL) {
      code = check_output(&outputs[i], dtype, data, outputs[i].path, rtol, atol);
      if (code != EXIT_OK && exit_code == EXIT_OK) exit_code = code;
    }
    if (write_outputs) {
      snprintf(path, sizeof(path), "%s/%s.npy", output_dir, outputs[i].info.name);
      if (!npy_write(path, dtype, outputs[i].info.rank, outputs[i].info.shape, data, error,
                     sizeof(error))) {
        fprintf(stderr, "run_model: output '%s': %s\n", outputs[i].info.name, error);
        free(data);
        exit_code = EXIT_BAD_INPUT;
        goto out;
      }
      npy_format_shape(outputs[i].info.rank, outputs[i].info.shape, shape, sizeof(shape));
      printf("wrote output '%s' %s %s to %s\n", outputs[i].info.name, tern_dtype_name(dtype), shape,
             path);
    }
    free(data);
  }

out:
  /* The queue first: destroying it waits for anything still running. */
  if (queue != NULL && failed(tern_queue_destroy(queue), "tern_queue_destroy")) {
    exit_code = EXIT_TERN_FAILED;
  }
  for (i = 0; i < MAX_TENSORS; ++i) {
    if (inputs[i].buffer != NULL &&
        failed(tern_buffer_free(inputs[i].buffer), "tern_buffer_free")) {
      exit_code = EXIT_TERN_FAILED;
    }
    if (outputs[i].buffer != NULL &&
        failed(tern_buffer_free(outputs[i].buffer), "tern_buffer_free")) {
      exit_code = EXIT_TERN_FAILED;
    }
  }
  if (executable != NULL && failed(tern_executable_unload(executable), "tern_executable_unload")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (core != NULL && failed(tern_core_close(core), "tern_core_close")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (failed(tern_shutdown(), "tern_shutdown")) exit_code = EXIT_TERN_FAILED;
  return exit_code;
}
