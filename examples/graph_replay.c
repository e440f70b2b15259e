/* graph_replay: record a sequence of commands once, replay it many times.
 *
 * A serving loop runs the same steps for every request: copy the input in,
 * run a few executions, copy the result out. Submitting each step costs the
 * calling thread a few hundred nanoseconds of checks and a hand-over to the
 * queue's engine; a graph (tern/graph.h) records the steps once, checked
 * once, and a launch hands the whole sequence over in one call. Operands
 * marked as parameters are rebound at each launch: here each request reads
 * its input from, and writes its result to, its own slot of a batch buffer.
 *
 * The program:
 *   1. builds "add" (z = x + y over 256 floats) and loads it;
 *   2. records: h = in + bias; h = h + bias; out = h + bias, then a host
 *      callback that counts finished requests;
 *   3. marks the first execution's input x and the last one's output z as
 *      parameters 0 and 1, and finalizes the graph;
 *   4. writes 8 requests into the slots of one input buffer, launches the
 *      graph once per request with that request's slots, waits once;
 *   5. checks every result (in + 3 * bias) on the host.
 *
 * Exit status: 0 when every result is right, 1 when a tern call failed (the
 * message says which and why), 2 when a result is wrong.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tern/tern.h>

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_MISMATCH = 2 };
enum { kFloats = 256, kRequests = 8, kLayers = 3 };

static int failed(tern_status_t status, const char* what) {
  if (status == TERN_OK) return 0;
  fprintf(stderr, "graph_replay: %s failed with %s\n  %s\n", what, tern_status_string(status),
          tern_last_error_message());
  return 1;
}

/* The host callback at the end of the graph: one more request done. */
static void count_request(void* user_data, tern_status_t status) {
  if (status == TERN_OK) ++*(int*)user_data;
}

static const int64_t kLength[1] = {kFloats};

static tern_operand_t whole(tern_segment_t segment, uint32_t index) {
  tern_operand_t operand;
  memset(&operand, 0, sizeof(operand));
  operand.segment = segment;
  operand.index = index;
  operand.dtype = TERN_DTYPE_F32;
  operand.rank = 1;
  operand.shape = kLength;
  return operand;
}

/* Builds z = x + y and loads it on `device`. */
static tern_status_t load_add(tern_device_t device, tern_executable_t* out) {
  tern_builder_t builder = NULL;
  tern_instruction_t add;
  tern_operand_t operands[3];
  const int64_t op[1] = {TERN_BINARY_ADD};
  void* data = NULL;
  uint64_t size = 0;
  tern_status_t status = tern_builder_create(NULL, &builder);
  if (status != TERN_OK) return status;
  operands[0] = whole(TERN_SEGMENT_OUTPUT, 0);
  operands[1] = whole(TERN_SEGMENT_INPUT, 0);
  operands[2] = whole(TERN_SEGMENT_INPUT, 1);
  memset(&add, 0, sizeof(add));
  add.struct_size = sizeof(add);
  add.opcode = TERN_OP_BINARY;
  add.operand_count = 3;
  add.operands = operands;
  add.int_count = 1;
  add.ints = op;
  if ((status = tern_builder_begin_function(builder, "add", NULL)) == TERN_OK &&
      (status = tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 1, kLength, NULL)) ==
          TERN_OK &&
      (status = tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 1, kLength, NULL)) ==
          TERN_OK &&
      (status = tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 1, kLength, NULL)) ==
          TERN_OK &&
      (status = tern_builder_add_instruction(builder, &add)) == TERN_OK &&
      (status = tern_builder_end_function(builder)) == TERN_OK &&
      (status = tern_builder_finish(builder, &data, &size)) == TERN_OK) {
    status = tern_executable_load(device, data, size, NULL, out);
    tern_builder_free_data(data);
  }
  tern_builder_destroy(builder);
  return status;
}

int main(void) {
  const uint64_t tensor_bytes = kFloats * sizeof(float);
  int exit_code = EXIT_TERN_FAILED;
  int finished = 0, wrong = 0, i, r;
  float* requests = malloc(kRequests * tensor_bytes);
  float* results = malloc(kRequests * tensor_bytes);
  float bias[kFloats];
  tern_device_t device = NULL;
  tern_core_t core = NULL;
  tern_queue_t queue = NULL;
  tern_executable_t add = NULL;
  tern_buffer_t inputs = NULL, outputs = NULL, bias_buffer = NULL, hidden = NULL;
  tern_graph_t graph = NULL;
  tern_buffer_params_t buffer_params;
  tern_graph_params_t graph_params;
  tern_graph_info_t info;
  uint32_t command = 0, input_parameter = 0, output_parameter = 0;
  uint64_t sequence = 0;

  if (requests == NULL || results == NULL) return EXIT_TERN_FAILED;
  for (i = 0; i < kFloats; ++i) bias[i] = 0.5f * (float)i;
  for (r = 0; r < kRequests; ++r) {
    for (i = 0; i < kFloats; ++i) requests[r * kFloats + i] = (float)(r * 1000 + i);
  }

  if (failed(tern_init(NULL), "tern_init")) goto out;
  if (failed(tern_device_get(0, &device), "tern_device_get")) goto out;
  if (failed(tern_core_open(device, 0, &core), "tern_core_open")) goto out;
  if (failed(tern_queue_create(core, NULL, &queue), "tern_queue_create")) goto out;
  if (failed(load_add(device, &add), "building and loading 'add'")) goto out;

  memset(&buffer_params, 0, sizeof(buffer_params));
  buffer_params.struct_size = sizeof(buffer_params);
  buffer_params.category = TERN_MEMORY_TENSORS;
  buffer_params.size = kRequests * tensor_bytes;
  if (failed(tern_buffer_alloc(device, &buffer_params, &inputs), "tern_buffer_alloc")) goto out;
  if (failed(tern_buffer_alloc(device, &buffer_params, &outputs), "tern_buffer_alloc")) goto out;
  buffer_params.size = tensor_bytes;
  if (failed(tern_buffer_alloc(device, &buffer_params, &bias_buffer), "tern_buffer_alloc"))
    goto out;
  if (failed(tern_buffer_alloc(device, &buffer_params, &hidden), "tern_buffer_alloc")) goto out;
  if (failed(tern_buffer_write(bias_buffer, 0, bias, tensor_bytes), "tern_buffer_write")) goto out;
  if (failed(tern_buffer_write(inputs, 0, requests, kRequests * tensor_bytes), "tern_buffer_write"))
    goto out;

  /* Record. Each call is checked now, as the queue call of the same name
   * would be; the graph does not run anything yet. */
  memset(&graph_params, 0, sizeof(graph_params));
  graph_params.struct_size = sizeof(graph_params);
  graph_params.name = "three-layers";
  if (failed(tern_graph_create(device, &graph_params, &graph), "tern_graph_create")) goto out;
  for (i = 0; i < kLayers; ++i) {
    /* Layer 0 reads slot 0 of the inputs (a parameter: rebound per request);
     * the last writes slot 0 of the outputs (also a parameter). */
    tern_binding_t in[2], z[1];
    in[0].buffer = i == 0 ? inputs : hidden;
    in[0].offset = 0;
    in[1].buffer = bias_buffer;
    in[1].offset = 0;
    z[0].buffer = i == kLayers - 1 ? outputs : hidden;
    z[0].offset = 0;
    if (failed(tern_graph_add_execute(graph, add, 0, in, 2, z, 1, &command),
               "tern_graph_add_execute"))
      goto out;
    if (i == 0 && failed(tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_INPUT, 0,
                                                  &input_parameter),
                         "tern_graph_add_parameter"))
      goto out;
    if (i == kLayers - 1 &&
        failed(tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_OUTPUT, 0,
                                        &output_parameter),
               "tern_graph_add_parameter"))
      goto out;
  }
  if (failed(tern_graph_add_host_callback(graph, count_request, &finished, NULL),
             "tern_graph_add_host_callback"))
    goto out;
  if (failed(tern_graph_finalize(graph), "tern_graph_finalize")) goto out;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  if (failed(tern_graph_get_info(graph, &info), "tern_graph_get_info")) goto out;
  printf("graph '%s': %u commands, %u parameters\n", info.name, info.command_count,
         info.parameter_count);

  /* Replay: one launch per request, each with its own slots. */
  for (r = 0; r < kRequests; ++r) {
    tern_graph_argument_t arguments[2];
    tern_graph_launch_params_t launch;
    memset(arguments, 0, sizeof(arguments));
    arguments[0].parameter = input_parameter;
    arguments[0].buffer = inputs;
    arguments[0].offset = (uint64_t)r * tensor_bytes;
    arguments[1].parameter = output_parameter;
    arguments[1].buffer = outputs;
    arguments[1].offset = (uint64_t)r * tensor_bytes;
    memset(&launch, 0, sizeof(launch));
    launch.struct_size = sizeof(launch);
    launch.argument_count = 2;
    launch.arguments = arguments;
    if (failed(tern_queue_launch_graph(queue, graph, &launch, &sequence),
               "tern_queue_launch_graph"))
      goto out;
  }
  if (failed(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize"))
    goto out;
  if (failed(tern_buffer_read(outputs, 0, results, kRequests * tensor_bytes), "tern_buffer_read"))
    goto out;

  for (r = 0; r < kRequests; ++r) {
    for (i = 0; i < kFloats; ++i) {
      const float expected = requests[r * kFloats + i] + kLayers * bias[i];
      if (results[r * kFloats + i] != expected && wrong++ < 5) {
        fprintf(stderr, "graph_replay: request %d element %d is %g, expected %g\n", r, i,
                (double)results[r * kFloats + i], (double)expected);
      }
    }
  }
  printf(
      "%d requests launched (last launch: command %llu of the queue), %d finished, %d wrong "
      "elements\n",
      kRequests, (unsigned long long)sequence, finished, wrong);
  exit_code = wrong == 0 && finished == kRequests ? EXIT_OK : EXIT_MISMATCH;

out:
  if (graph != NULL) tern_graph_destroy(graph);
  if (hidden != NULL) tern_buffer_free(hidden);
  if (bias_buffer != NULL) tern_buffer_free(bias_buffer);
  if (outputs != NULL) tern_buffer_free(outputs);
  if (inputs != NULL) tern_buffer_free(inputs);
  if (add != NULL) tern_executable_unload(add);
  if (queue != NULL) tern_queue_destroy(queue);
  if (core != NULL) tern_core_close(core);
  tern_shutdown();
  free(requests);
  free(results);
  return exit_code;
}
