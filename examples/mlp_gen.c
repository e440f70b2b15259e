/* mlp_gen: write a 2-layer MLP executable with its weights, a sample input
 * and the output it should produce.
 *
 * The model is y = relu(x @ W1 + b1) @ W2 + b2 on f32 tensors:
 *   x  [batch, in]      the function's input "x"
 *   W1 [in, hidden], b1 [hidden], W2 [hidden, out], b2 [out]: constants,
 *      stored in the executable (mapped from the file when it is loaded)
 *   h  [batch, hidden]  an intermediate, in the function's scratch memory
 *   y  [batch, out]     the function's output "y"
 * Weights and input are drawn from a seeded generator, so a given command
 * line always writes the same files; the expected output is computed by a
 * plain C reference (double accumulation), independent of tern.
 *
 * The two matmuls run on the Tensor engine and the relu on the Scalar
 * engine. Engines run their instruction streams concurrently, so the
 * program orders them with semaphores (docs/isa.md, Sync):
 *   Tensor: matmul h = x W1 + b1; signal s0 += 1
 *   Scalar: wait s0 >= 1; h = relu(h); signal s1 += 1
 *   Tensor: wait s1 >= 1; matmul y = h W2 + b2
 *
 * Run:   ./mlp_gen mlp.tern x.npy y_expected.npy
 *        ./mlp_gen --seed 7 --batch 4 --in 32 --hidden 64 --out 3 m.tern x.npy y.npy
 * then:  ./run_model mlp.tern x.npy --expect y_expected.npy
 *
 * Exit status: 0 when the three files were written, 1 when a tern call
 * failed, 3 on a bad command line or when a file cannot be written.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tern/builder.h>
#include <tern/tern.h>

#include "npy.h"

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_USAGE = 3 };

static int failed(tern_status_t status, const char* what) {
  const char* name;
  const char* message;
  if (status == TERN_OK) return 0;
  name = tern_status_string(status);
  message = tern_last_error_message();
  fprintf(stderr, "mlp_gen: %s failed with %s\n  %s\n", what, name, message);
  return 1;
}

/* A small deterministic generator (xorshift64*), so that the same seed
 * gives the same model on every machine. */
static uint64_t next_random(uint64_t* state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [-scale, scale), from the top 24 bits. */
static float uniform(uint64_t* state, float scale) {
  const float unit = (float)(next_random(state) >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * scale;
}

typedef struct sizes {
  int64_t batch, in, hidden, out;
} sizes;

typedef struct model {
  sizes n;
  float* w1; /* [in, hidden] */
  float* b1; /* [hidden] */
  float* w2; /* [hidden, out] */
  float* b2; /* [out] */
  float* x;  /* [batch, in] */
  float* y;  /* [batch, out], the reference output */
} model;

static void free_model(model* m) {
  free(m->w1);
  free(m->b1);
  free(m->w2);
  free(m->b2);
  free(m->x);
  free(m->y);
}

/* Weights as PyTorch initialises nn.Linear (uniform, 1/sqrt(fan_in)), and
 * an input in [-1, 1). */
static int make_model(const sizes* n, uint64_t seed, model* m) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1; /* never 0 */
  int64_t i;
  memset(m, 0, sizeof(*m));
  m->n = *n;
  m->w1 = malloc(sizeof(float) * (size_t)(n->in * n->hidden));
  m->b1 = malloc(sizeof(float) * (size_t)n->hidden);
  m->w2 = malloc(sizeof(float) * (size_t)(n->hidden * n->out));
  m->b2 = malloc(sizeof(float) * (size_t)n->out);
  m->x = malloc(sizeof(float) * (size_t)(n->batch * n->in));
  m->y = malloc(sizeof(float) * (size_t)(n->batch * n->out));
  if (!m->w1 || !m->b1 || !m->w2 || !m->b2 || !m->x || !m->y) {
    fprintf(stderr, "mlp_gen: out of host memory\n");
    return 0;
  }
  for (i = 0; i < n->in * n->hidden; ++i) m->w1[i] = uniform(&state, 1.0f / sqrtf((float)n->in));
  for (i = 0; i < n->hidden; ++i) m->b1[i] = uniform(&state, 1.0f / sqrtf((float)n->in));
  for (i = 0; i < n->hidden * n->out; ++i) {
    m->w2[i] = uniform(&state, 1.0f / sqrtf((float)n->hidden));
  }
  for (i = 0; i < n->out; ++i) m->b2[i] = uniform(&state, 1.0f / sqrtf((float)n->hidden));
  for (i = 0; i < n->batch * n->in; ++i) m->x[i] = uniform(&state, 1.0f);
  return 1;
}

/* The reference: the textbook loops, accumulating in double. */
static void reference_forward(model* m) {
  const sizes* n = &m->n;
  double* h = malloc(sizeof(double) * (size_t)n->hidden);
  int64_t b, i, j;
  if (h == NULL) return;
  for (b = 0; b < n->batch; ++b) {
    for (j = 0; j < n->hidden; ++j) {
      double sum = m->b1[j];
      for (i = 0; i < n->in; ++i) sum += (double)m->x[b * n->in + i] * m->w1[i * n->hidden + j];
      /* The device keeps h in f32 between the layers; so does the reference. */
      h[j] = sum > 0.0 ? (double)(float)sum : 0.0;
    }
    for (j = 0; j < n->out; ++j) {
      double sum = m->b2[j];
      for (i = 0; i < n->hidden; ++i) sum += h[i] * m->w2[i * n->out + j];
      m->y[b * n->out + j] = (float)sum;
    }
  }
  free(h);
}

static tern_operand_t tensor(tern_segment_t segment, uint32_t index, uint64_t offset, uint32_t rank,
                             const int64_t* shape) {
  tern_operand_t operand;
  memset(&operand, 0, sizeof(operand));
  operand.segment = segment;
  operand.index = index;
  operand.offset = offset;
  operand.dtype = TERN_DTYPE_F32;
  operand.rank = rank;
  operand.shape = shape;
  operand.strides = NULL; /* contiguous */
  return operand;
}

static tern_status_t add_instruction(tern_builder_t builder, tern_opcode_t opcode,
                                     uint32_t operand_count, const tern_operand_t* operands,
                                     uint32_t int_count, const int64_t* ints,
                                     const char* debug_op) {
  tern_instruction_t instruction;
  memset(&instruction, 0, sizeof(instruction));
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = opcode;
  instruction.core = 0;
  instruction.operand_count = operand_count;
  instruction.operands = operands;
  instruction.int_count = int_count;
  instruction.ints = ints;
  instruction.debug_op = debug_op;
  return tern_builder_add_instruction(builder, &instruction);
}

/* Builds the executable and writes it to `path`. */
static int write_executable(const model* m, const char* path) {
  const sizes* n = &m->n;
  const int64_t x_shape[2] = {n->batch, n->in};
  const int64_t h_shape[2] = {n->batch, n->hidden};
  const int64_t y_shape[2] = {n->batch, n->out};
  const int64_t w1_shape[2] = {n->in, n->hidden};
  const int64_t b1_shape[1] = {n->hidden};
  const int64_t w2_shape[2] = {n->hidden, n->out};
  const int64_t b2_shape[1] = {n->out};
  /* Semaphore instructions take [semaphore, value, engine] in the builder:
   * the engine is the stream the instruction belongs to (in the file the
   * stream itself says that, so the file stores only the first two). */
  const int64_t signal_s0[3] = {0, 1, TERN_ENGINE_TENSOR};
  const int64_t wait_s0[3] = {0, 1, TERN_ENGINE_SCALAR};
  const int64_t signal_s1[3] = {1, 1, TERN_ENGINE_SCALAR};
  const int64_t wait_s1[3] = {1, 1, TERN_ENGINE_TENSOR};
  const int64_t relu[1] = {TERN_UNARY_RELU};
  uint64_t w1, b1, w2, b2;
  tern_builder_t builder = NULL;
  tern_operand_t operands[4];
  int ok = 0;

  if (failed(tern_builder_create(NULL, &builder), "tern_builder_create")) return 0;
  /* Constants first: instructions can only name constants that exist. Each
   * tensor is aligned to 64 bytes (the minimum) for the vector units. */
  if (failed(tern_builder_add_constants(builder, m->w1,
                                        sizeof(float) * (uint64_t)(n->in * n->hidden), 64, &w1),
             "tern_builder_add_constants(W1)") ||
      failed(
          tern_builder_add_constants(builder, m->b1, sizeof(float) * (uint64_t)n->hidden, 64, &b1),
          "tern_builder_add_constants(b1)") ||
      failed(tern_builder_add_constants(builder, m->w2,
                                        sizeof(float) * (uint64_t)(n->hidden * n->out), 64, &w2),
             "tern_builder_add_constants(W2)") ||
      failed(tern_builder_add_constants(builder, m->b2, sizeof(float) * (uint64_t)n->out, 64, &b2),
             "tern_builder_add_constants(b2)")) {
    goto out;
  }
  if (failed(tern_builder_begin_function(builder, "mlp", NULL), "tern_builder_begin_function") ||
      failed(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, x_shape, NULL),
             "tern_builder_add_input(x)") ||
      failed(tern_builder_add_output(builder, "y", TERN_DTYPE_F32, 2, y_shape, NULL),
             "tern_builder_add_output(y)") ||
      failed(tern_builder_set_scratch(builder, sizeof(float) * (uint64_t)(n->batch * n->hidden)),
             "tern_builder_set_scratch")) {
    goto out;
  }
  /* Layer 1 on the Tensor engine: h = x @ W1 + b1 (operands: out first). */
  operands[0] = tensor(TERN_SEGMENT_SCRATCH, 0, 0, 2, h_shape);
  operands[1] = tensor(TERN_SEGMENT_INPUT, 0, 0, 2, x_shape);
  operands[2] = tensor(TERN_SEGMENT_CONSTANT, 0, w1, 2, w1_shape);
  operands[3] = tensor(TERN_SEGMENT_CONSTANT, 0, b1, 1, b1_shape);
  if (failed(add_instruction(builder, TERN_OP_MATMUL, 4, operands, 0, NULL, "mlp.fc1"),
             "adding fc1") ||
      failed(add_instruction(builder, TERN_OP_SEM_SIGNAL, 0, NULL, 3, signal_s0, "mlp.fc1"),
             "adding the signal after fc1")) {
    goto out;
  }
  /* The activation on the Scalar engine, in place, once fc1 is done. */
  operands[0] = tensor(TERN_SEGMENT_SCRATCH, 0, 0, 2, h_shape);
  operands[1] = tensor(TERN_SEGMENT_SCRATCH, 0, 0, 2, h_shape);
  if (failed(add_instruction(builder, TERN_OP_SEM_WAIT, 0, NULL, 3, wait_s0, "mlp.relu"),
             "adding the wait before relu") ||
      failed(add_instruction(builder, TERN_OP_UNARY, 2, operands, 1, relu, "mlp.relu"),
             "adding relu") ||
      failed(add_instruction(builder, TERN_OP_SEM_SIGNAL, 0, NULL, 3, signal_s1, "mlp.relu"),
             "adding the signal after relu")) {
    goto out;
  }
  /* Layer 2 on the Tensor engine, once relu is done: y = h @ W2 + b2. */
  operands[0] = tensor(TERN_SEGMENT_OUTPUT, 0, 0, 2, y_shape);
  operands[1] = tensor(TERN_SEGMENT_SCRATCH, 0, 0, 2, h_shape);
  operands[2] = tensor(TERN_SEGMENT_CONSTANT, 0, w2, 2, w2_shape);
  operands[3] = tensor(TERN_SEGMENT_CONSTANT, 0, b2, 1, b2_shape);
  if (failed(add_instruction(builder, TERN_OP_SEM_WAIT, 0, NULL, 3, wait_s1, "mlp.fc2"),
             "adding the wait before fc2") ||
      failed(add_instruction(builder, TERN_OP_MATMUL, 4, operands, 0, NULL, "mlp.fc2"),
             "adding fc2")) {
    goto out;
  }
  /* end_function checks the scratch size and that the semaphores cannot
   * deadlock; write_file replaces `path` atomically. */
  if (failed(tern_builder_end_function(builder), "tern_builder_end_function") ||
      failed(tern_builder_write_file(builder, path), "tern_builder_write_file")) {
    goto out;
  }
  ok = 1;
out:
  if (failed(tern_builder_destroy(builder), "tern_builder_destroy")) ok = 0;
  return ok;
}

static int parse_size(const char* flag, const char* text, int64_t max, int64_t* out) {
  char* end;
  long long value = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > max) {
    fprintf(stderr, "mlp_gen: %s takes an integer from 1 to %lld, not '%s'\n", flag, (long long)max,
            text);
    return 0;
  }
  *out = (int64_t)value;
  return 1;
}

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [--seed N] [--batch B] [--in I] [--hidden H] [--out O]\n"
          "           MODEL.tern INPUT.npy EXPECTED.npy\n"
          "Writes a 2-layer MLP (y = relu(x W1 + b1) W2 + b2, f32) with seeded weights to\n"
          "MODEL.tern, a seeded input x [B, I] to INPUT.npy, and the output the model\n"
          "should give for it, computed on the host, to EXPECTED.npy.\n"
          "Defaults: --seed 1 --batch 16 --in 256 --hidden 512 --out 10.\n",
          argv0);
}

int main(int argc, char** argv) {
  sizes n = {16, 256, 512, 10};
  int64_t seed = 1;
  const char* paths[3] = {NULL, NULL, NULL};
  int path_count = 0;
  model m;
  int64_t shape[2];
  char error[512];
  int i;
  int exit_code = EXIT_USAGE;

  for (i = 1; i < argc; ++i) {
    int64_t* target = NULL;
    int64_t max = 1 << 16;
    if (strcmp(argv[i], "--seed") == 0) {
      target = &seed;
      max = INT64_MAX;
    } else if (strcmp(argv[i], "--batch") == 0) {
      target = &n.batch;
    } else if (strcmp(argv[i], "--in") == 0) {
      target = &n.in;
    } else if (strcmp(argv[i], "--hidden") == 0) {
      target = &n.hidden;
    } else if (strcmp(argv[i], "--out") == 0) {
      target = &n.out;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(argv[0]);
      return EXIT_OK;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "mlp_gen: unknown option '%s'\n", argv[i]);
      usage(argv[0]);
      return EXIT_USAGE;
    } else if (path_count < 3) {
      paths[path_count++] = argv[i];
      continue;
    } else {
      usage(argv[0]);
      return EXIT_USAGE;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "mlp_gen: %s needs a value\n", argv[i]);
      return EXIT_USAGE;
    }
    if (!parse_size(argv[i], argv[i + 1], max, target)) return EXIT_USAGE;
    ++i;
  }
  if (path_count != 3) {
    usage(argv[0]);
    return EXIT_USAGE;
  }
  if (n.in * n.hidden > (1 << 26) || n.hidden * n.out > (1 << 26) || n.batch * n.in > (1 << 26)) {
    fprintf(stderr, "mlp_gen: a weight or input of more than 64M elements is too large here\n");
    return EXIT_USAGE;
  }

  if (!make_model(&n, (uint64_t)seed, &m)) {
    free_model(&m);
    return EXIT_TERN_FAILED;
  }
  reference_forward(&m);
  if (!write_executable(&m, paths[0])) {
    exit_code = EXIT_TERN_FAILED;
    goto out;
  }
  shape[0] = n.batch;
  shape[1] = n.in;
  if (!npy_write(paths[1], TERN_DTYPE_F32, 2, shape, m.x, error, sizeof(error))) {
    fprintf(stderr, "mlp_gen: %s\n", error);
    goto out;
  }
  shape[1] = n.out;
  if (!npy_write(paths[2], TERN_DTYPE_F32, 2, shape, m.y, error, sizeof(error))) {
    fprintf(stderr, "mlp_gen: %s\n", error);
    goto out;
  }
  printf(
      "wrote %s: mlp(x [%lld, %lld]) -> y [%lld, %lld], hidden %lld, seed %lld, "
      "%.1f KiB of weights\n",
      paths[0], (long long)n.batch, (long long)n.in, (long long)n.batch, (long long)n.out,
      (long long)n.hidden, (long long)seed,
      (double)(n.in * n.hidden + n.hidden + n.hidden * n.out + n.out) * 4.0 / 1024.0);
  printf("wrote %s (the input) and %s (the expected output)\n", paths[1], paths[2]);
  exit_code = EXIT_OK;
out:
  free_model(&m);
  return exit_code;
}
