/* vector_add: build a one-instruction executable, load it, run it.
 *
 * An executable is a compiled program: functions with named inputs and
 * outputs, and the instructions that compute them (docs/isa.md). Compilers
 * and frameworks make them with the builder API (tern/builder.h); this
 * example makes the smallest useful one, c = a + b over n floats, and then
 * does what every program that runs a model does:
 *   1. build the executable in memory (no device needed for that);
 *   2. start the runtime, open a core, create a queue;
 *   3. load the executable on the device: it is validated once, here;
 *   4. allocate device buffers for its inputs and output, copy the inputs in;
 *   5. execute it on the queue, copy the result out, wait once;
 *   6. check every element against the same sum computed on the host;
 *   7. clean up.
 *
 * Run:   ./vector_add            (n = 1048576)
 *        ./vector_add 1000       (any n from 1 to 67108864)
 *
 * Exit status: 0 when every element is right, 1 when a tern call failed (the
 * message says which and why), 2 when an element is wrong, 3 on a bad
 * command line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tern/builder.h>
#include <tern/tern.h>

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_MISMATCH = 2, EXIT_USAGE = 3 };

/* Prints a failed call with its status name and the runtime's message, and
 * returns 1 so that callers can write `if (failed(...)) goto out;`. */
static int failed(tern_status_t status, const char* what) {
  const char* name;
  const char* message;
  if (status == TERN_OK) return 0;
  /* The message is the calling thread's, valid until its next tern call;
   * tern_status_string() does not replace it. */
  name = tern_status_string(status);
  message = tern_last_error_message();
  fprintf(stderr, "vector_add: %s failed with %s\n  %s\n", what, name, message);
  return 1;
}

/* An operand that is the whole of input or output `index`: a contiguous
 * f32 vector of `*length` elements. strides NULL means contiguous. */
static tern_operand_t whole_vector(tern_segment_t segment, uint32_t index, const int64_t* length) {
  tern_operand_t operand;
  memset(&operand, 0, sizeof(operand));
  operand.segment = segment;
  operand.index = index;
  operand.offset = 0;
  operand.dtype = TERN_DTYPE_F32;
  operand.rank = 1;
  operand.shape = length;
  operand.strides = NULL;
  return operand;
}

/* Step 1: one function "vector_add" with inputs "a" and "b" and output "c",
 * all f32 [n], and one instruction: BINARY ADD, whose operands are listed
 * output first (docs/isa.md). On success *out_data holds the executable; free
 * it with tern_builder_free_data(). */
static int build_vector_add(int64_t n, void** out_data, uint64_t* out_size) {
  tern_builder_t builder = NULL;
  const int64_t length[1] = {n};
  tern_operand_t operands[3];
  const int64_t ints[1] = {TERN_BINARY_ADD};
  tern_instruction_t add;
  int ok = 0;

  if (failed(tern_builder_create(NULL, &builder), "tern_builder_create")) return 0;
  if (failed(tern_builder_begin_function(builder, "vector_add", NULL),
             "tern_builder_begin_function") ||
      failed(tern_builder_add_input(builder, "a", TERN_DTYPE_F32, 1, length, NULL),
             "tern_builder_add_input(a)") ||
      failed(tern_builder_add_input(builder, "b", TERN_DTYPE_F32, 1, length, NULL),
             "tern_builder_add_input(b)") ||
      failed(tern_builder_add_output(builder, "c", TERN_DTYPE_F32, 1, length, NULL),
             "tern_builder_add_output(c)")) {
    goto out;
  }
  operands[0] = whole_vector(TERN_SEGMENT_OUTPUT, 0, length); /* c */
  operands[1] = whole_vector(TERN_SEGMENT_INPUT, 0, length);  /* a */
  operands[2] = whole_vector(TERN_SEGMENT_INPUT, 1, length);  /* b */
  memset(&add, 0, sizeof(add));
  add.struct_size = sizeof(add);
  add.opcode = TERN_OP_BINARY;
  add.core = 0;
  add.operand_count = 3;
  add.operands = operands;
  add.int_count = 1;
  add.ints = ints;
  add.float_count = 0;
  add.floats = NULL;
  /* Shows up in the error message if this instruction ever fails. */
  add.debug_op = "examples/vector_add.c: c = a + b";
  /* The builder checks each instruction as it is added (shapes, dtypes,
   * operands inside their tensors), so a mistake is reported here, by
   * instruction and operand, rather than at load time. */
  if (failed(tern_builder_add_instruction(builder, &add), "tern_builder_add_instruction") ||
      failed(tern_builder_end_function(builder), "tern_builder_end_function") ||
      failed(tern_builder_finish(builder, out_data, out_size), "tern_builder_finish")) {
    goto out;
  }
  ok = 1;
out:
  if (failed(tern_builder_destroy(builder), "tern_builder_destroy")) ok = 0;
  return ok;
}

/* Prints the function's signature as the loaded executable describes it. */
static int print_signature(tern_executable_t executable, uint32_t function) {
  tern_function_info_t info;
  tern_tensor_info_t tensor;
  uint32_t i;
  int output;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  if (failed(tern_executable_function_info(executable, function, &info),
             "tern_executable_function_info")) {
    return 1;
  }
  printf("function '%s': %u instruction(s)\n", info.name, info.instruction_count);
  for (output = 0; output <= 1; ++output) {
    const uint32_t count = output ? info.output_count : info.input_count;
    for (i = 0; i < count; ++i) {
      memset(&tensor, 0, sizeof(tensor));
      tensor.struct_size = sizeof(tensor);
      if (failed(tern_executable_tensor_info(executable, function, output, i, &tensor),
                 "tern_executable_tensor_info")) {
        return 1;
      }
      printf("  %s %u '%s': f32 [%lld], %llu bytes\n", output ? "output" : "input ", i, tensor.name,
             (long long)tensor.shape[0], (unsigned long long)tensor.size_bytes);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  int64_t n = 1 << 20;
  uint64_t bytes;
  void* data = NULL;
  uint64_t size = 0;
  tern_device_t device = NULL;
  tern_core_t core = NULL;
  tern_queue_t queue = NULL;
  tern_executable_t executable = NULL;
  tern_buffer_t buffers[3] = {NULL, NULL, NULL}; /* a, b, c */
  tern_buffer_params_t params;
  tern_binding_t inputs[2];
  tern_binding_t outputs[1];
  uint32_t function = 0;
  float* a = NULL;
  float* b = NULL;
  float* c = NULL;
  int64_t i;
  int k;
  char* end;
  int exit_code = EXIT_TERN_FAILED; /* until every step has succeeded */

  if (argc > 2) {
    fprintf(stderr, "usage: %s [n, 1-67108864; default 1048576]\n", argv[0]);
    return EXIT_USAGE;
  }
  if (argc == 2) {
    long long value = strtoll(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || value < 1 || value > (64ll << 20)) {
      fprintf(stderr, "usage: %s [n, 1-67108864; default 1048576]\n", argv[0]);
      return EXIT_USAGE;
    }
    n = (int64_t)value;
  }
  bytes = (uint64_t)n * sizeof(float);

  /* 1. Build. Builders need neither a device nor tern_init(). */
  if (!build_vector_add(n, &data, &size)) return EXIT_TERN_FAILED;
  printf("built an executable of %llu bytes\n", (unsigned long long)size);

  /* 2. The runtime, device 0, core 0 (ours alone until closed), a queue. */
  if (failed(tern_init(NULL), "tern_init")) {
    tern_builder_free_data(data);
    return EXIT_TERN_FAILED;
  }
  if (failed(tern_device_get(0, &device), "tern_device_get(0)")) goto out;
  if (failed(tern_core_open(device, 0, &core), "tern_core_open(device 0, core 0)")) goto out;
  if (failed(tern_queue_create(core, NULL, &queue), "tern_queue_create")) goto out;

  /* 3. Load: everything is validated once, here (a malformed executable is
   * rejected with a message that says what is wrong). The bytes may be
   * freed as soon as the call returns. */
  if (failed(tern_executable_load(device, data, size, NULL, &executable), "tern_executable_load")) {
    goto out;
  }
  tern_builder_free_data(data);
  data = NULL;
  if (failed(tern_executable_find_function(executable, "vector_add", &function),
             "tern_executable_find_function") ||
      print_signature(executable, function)) {
    goto out;
  }

  /* 4. Host data, and a device buffer for each of a, b and c. */
  a = malloc(bytes);
  b = malloc(bytes);
  c = malloc(bytes);
  if (a == NULL || b == NULL || c == NULL) {
    fprintf(stderr, "vector_add: cannot allocate 3 x %llu bytes of host memory\n",
            (unsigned long long)bytes);
    goto out;
  }
  for (i = 0; i < n; ++i) {
    a[i] = (float)i * 0.5f;
    b[i] = 1000.0f - (float)(i % 1000);
    c[i] = -1.0f; /* anything but the answer */
  }
  memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.size = bytes;
  params.alignment = 0; /* the device minimum */
  params.category = TERN_MEMORY_TENSORS;
  for (k = 0; k < 3; ++k) {
    if (failed(tern_buffer_alloc(device, &params, &buffers[k]), "tern_buffer_alloc")) goto out;
  }

  /* 5. Submit everything, then wait once: the queue runs its commands in
   * order, so the execution starts after both copies in and the copy out
   * starts after the execution. Inputs and outputs are bound by index, in
   * the order the builder declared them. */
  inputs[0].buffer = buffers[0];
  inputs[0].offset = 0;
  inputs[1].buffer = buffers[1];
  inputs[1].offset = 0;
  outputs[0].buffer = buffers[2];
  outputs[0].offset = 0;
  if (failed(tern_queue_copy_h2d(queue, buffers[0], 0, a, bytes, NULL), "tern_queue_copy_h2d(a)") ||
      failed(tern_queue_copy_h2d(queue, buffers[1], 0, b, bytes, NULL), "tern_queue_copy_h2d(b)") ||
      failed(tern_queue_execute(queue, executable, function, inputs, 2, outputs, 1, NULL),
             "tern_queue_execute") ||
      failed(tern_queue_copy_d2h(queue, c, buffers[2], 0, bytes, NULL), "tern_queue_copy_d2h(c)")) {
    goto out;
  }
  /* A command that fails makes the queue's error sticky: synchronize returns
   * it, with a message that names the failing command. */
  if (failed(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize")) {
    goto out;
  }

  /* 6. Check: f32 addition is exact IEEE arithmetic on both sides. */
  for (i = 0; i < n; ++i) {
    const float expected = a[i] + b[i];
    if (c[i] != expected) {
      fprintf(stderr, "vector_add: c[%lld] is %.9g but a + b is %.9g\n", (long long)i, (double)c[i],
              (double)expected);
      exit_code = EXIT_MISMATCH;
      goto out;
    }
  }
  printf("c = a + b for %lld elements: correct\n", (long long)n);
  for (i = 0; i < n && i < 3; ++i) {
    printf("  c[%lld] = %g + %g = %g\n", (long long)i, (double)a[i], (double)b[i], (double)c[i]);
  }
  if (n > 3) {
    printf("  ...\n  c[%lld] = %g + %g = %g\n", (long long)(n - 1), (double)a[n - 1],
           (double)b[n - 1], (double)c[n - 1]);
  }
  exit_code = EXIT_OK;

out:
  /* 7. Clean up in reverse order, whatever happened above. Destroying the
   * queue first waits for any command still using the buffers or the host
   * arrays; a queue must also go before its core is closed. */
  if (queue != NULL && failed(tern_queue_destroy(queue), "tern_queue_destroy")) {
    exit_code = EXIT_TERN_FAILED;
  }
  for (k = 2; k >= 0; --k) {
    if (buffers[k] != NULL && failed(tern_buffer_free(buffers[k]), "tern_buffer_free")) {
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
  tern_builder_free_data(data);
  free(c);
  free(b);
  free(a);
  return exit_code;
}
