// Writes executables for fuzzing and for the regression corpus:
//   exe_corpus_gen --valid DIR      valid executables (the fuzzer's seeds)
//   exe_corpus_gen --malformed DIR  malformed ones, named <what>.<status>.bin
//                                   with the status the loader must return
// tests/executable/corpus/ holds the checked-in output of --malformed plus
// the inputs the fuzzer found (same naming); fuzz/corpus/ the --valid seeds.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "exe_test_util.h"

namespace {

using exetest::Bytes;
using tern::format::ModuleT;

void Write(const std::string& dir, const std::string& name, const Bytes& data) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!out.good()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
}

Bytes BuildUnaryChain() {
  static const int64_t shape[3] = {2, 3, 5};
  tern_builder_t builder = nullptr;
  tern_builder_create(nullptr, &builder);
  float weights[30];
  for (int i = 0; i < 30; ++i) weights[i] = 0.5f * static_cast<float>(i);
  uint64_t offset = 0;
  tern_builder_add_constants(builder, weights, sizeof(weights), 128, &offset);
  tern_builder_begin_function(builder, "gelu_of_sum", nullptr);
  tern_builder_add_input(builder, "in", TERN_DTYPE_F32, 3, shape, nullptr);
  tern_builder_add_output(builder, "out", TERN_DTYPE_F32, 3, shape, nullptr);
  tern_builder_set_scratch(builder, 120);
  tern_operand_t sum[3] = {
      exetest::Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 3, shape),
      exetest::Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 3, shape),
      exetest::Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 3, shape, offset)};
  const int64_t add[1] = {TERN_BINARY_ADD};
  tern_instruction_t first{};
  first.struct_size = sizeof(first);
  first.opcode = TERN_OP_BINARY;
  first.operand_count = 3;
  first.operands = sum;
  first.int_count = 1;
  first.ints = add;
  first.debug_op = "aten::add";
  tern_builder_add_instruction(builder, &first);
  const int64_t signal[3] = {3, 1, TERN_ENGINE_VECTOR};
  tern_instruction_t sem{};
  sem.struct_size = sizeof(sem);
  sem.opcode = TERN_OP_SEM_SIGNAL;
  sem.int_count = 3;
  sem.ints = signal;
  tern_builder_add_instruction(builder, &sem);
  const int64_t wait[3] = {3, 1, TERN_ENGINE_SCALAR};
  sem.opcode = TERN_OP_SEM_WAIT;
  sem.ints = wait;
  tern_builder_add_instruction(builder, &sem);
  tern_operand_t act[2] = {exetest::Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 3, shape),
                           exetest::Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 3, shape)};
  const int64_t gelu[1] = {TERN_UNARY_GELU};
  tern_instruction_t second{};
  second.struct_size = sizeof(second);
  second.opcode = TERN_OP_UNARY;
  second.operand_count = 2;
  second.operands = act;
  second.int_count = 1;
  second.ints = gelu;
  second.debug_op = "aten::gelu";
  tern_builder_add_instruction(builder, &second);
  tern_builder_end_function(builder);
  void* data = nullptr;
  uint64_t size = 0;
  if (tern_builder_finish(builder, &data, &size) != TERN_OK) {
    std::fprintf(stderr, "building gelu_of_sum failed: %s\n", tern_last_error_message());
    std::exit(1);
  }
  Bytes bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  tern_builder_destroy(builder);
  return bytes;
}

void WriteValid(const std::string& dir) {
  Write(dir, "add.bin", exetest::BuildAdd());
  Write(dir, "add_constants.bin", exetest::BuildAdd(true));
  Write(dir, "pipeline.bin", exetest::BuildPipeline());
  Write(dir, "gelu_of_sum.bin", BuildUnaryChain());
  Write(dir, "fused.bin", exetest::BuildFused());
  Write(dir, "scan_topk.bin", exetest::BuildScanTopk());
  Write(dir, "scatter.bin", exetest::BuildScatter());
  for (const auto& program : exetest::HazardCorpus()) {
    if (program.race == nullptr) Write(dir, std::string(program.name) + ".bin", program.bytes);
  }
}

template <typename Edit>
Bytes Module(const Bytes& base, Edit edit) {
  return exetest::EditModule(base, edit);
}

std::string Code(tern_status_t status) { return std::to_string(status); }

void WriteMalformed(const std::string& dir) {
  const std::string invalid = "." + Code(TERN_ERROR_EXECUTABLE_INVALID) + ".bin";
  const std::string unsupported = "." + Code(TERN_ERROR_EXECUTABLE_UNSUPPORTED) + ".bin";
  const std::string checksum = "." + Code(TERN_ERROR_EXECUTABLE_CHECKSUM) + ".bin";
  const Bytes add = exetest::BuildAdd();
  const Bytes constants = exetest::BuildAdd(true);
  const Bytes pipeline = exetest::BuildPipeline();
  for (const auto& program : exetest::HazardCorpus()) {
    if (program.race != nullptr) Write(dir, program.name + invalid, program.bytes);
  }

  // Container.
  Write(dir, "empty" + invalid, {});
  Write(dir, "truncated_header" + invalid, Bytes(add.begin(), add.begin() + 63));
  Write(dir, "truncated_tail" + invalid, Bytes(add.begin(), add.end() - 1));
  Write(dir, "truncated_constants" + invalid, Bytes(constants.begin(), constants.end() - 100));
  Bytes magic = add;
  magic[3] = 'X';
  Write(dir, "bad_magic" + invalid, magic);
  exetest::Image image = exetest::Decode(add);
  image.major = 2;
  Write(dir, "newer_major" + unsupported, exetest::Encode(image));
  image = exetest::Decode(add);
  image.required_features = 1ull << 63;
  Write(dir, "unknown_required_feature" + unsupported, exetest::Encode(image));
  image = exetest::Decode(exetest::BuildFused());
  image.required_features = 0;  // fused instructions whose features the header omits
  Write(dir, "undeclared_features" + invalid, exetest::Encode(image));
  image = exetest::Decode(add);
  image.sections.push_back({99, 0, Bytes(16, 1)});
  Write(dir, "unknown_required_section" + unsupported, exetest::Encode(image));
  Bytes flipped = add;
  flipped[flipped.size() / 2] ^= 4;
  Write(dir, "flipped_module_byte" + checksum, flipped);
  flipped = constants;
  flipped[flipped.size() - 5] ^= 1;
  Write(dir, "flipped_constants_byte" + checksum, flipped);
  flipped = add;
  flipped[49] ^= 1;
  Write(dir, "flipped_header_byte" + checksum, flipped);
  Bytes sections = add;
  uint32_t count = 5000;
  std::memcpy(sections.data() + 32, &count, 4);
  exetest::FixHeaderChecksum(&sections);
  Write(dir, "too_many_sections" + invalid, sections);
  Bytes table = add;
  uint64_t table_offset = 1ull << 62;
  std::memcpy(table.data() + 24, &table_offset, 8);
  Write(dir, "table_out_of_file" + invalid, table);
  image = exetest::Decode(add);
  image.sections[0].bytes.assign(64, 0xee);
  Write(dir, "module_not_flatbuffer" + invalid, exetest::Encode(image));
  image = exetest::Decode(constants);
  image.Find(exetest::kConstants)->bytes.resize(64);
  Write(dir, "constants_size_mismatch" + invalid, exetest::Encode(image));
  image = exetest::Decode(add);
  image.sections.push_back(image.sections[0]);
  Write(dir, "two_modules" + invalid, exetest::Encode(image));

  // Module.
  Write(dir, "other_target" + unsupported, Module(add, [](ModuleT* m) { m->target = "gpu"; }));
  Write(dir, "operand_out_of_input" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[1]->offset = 1;
        }));
  Write(dir, "operand_offset_overflow" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[0]->offset = ~0ull - 10;
        }));
  Write(dir, "stride_out_of_input" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[2]->strides = {1ll << 50, 1};
        }));
  Write(dir, "negative_stride" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[2]->strides = {-8, 1};
        }));
  Write(dir, "operand_index_out_of_range" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[0]->index = 3;
        }));
  Write(dir, "scratch_without_scratch" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[0]->segment = TERN_SEGMENT_SCRATCH;
          m->functions[0]->streams[0]->instructions[0]->operands[0]->index = 0;
        }));
  Write(dir, "writes_constants" + invalid, Module(constants, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[0]->segment =
              TERN_SEGMENT_CONSTANT;
          m->functions[0]->streams[0]->instructions[0]->operands[0]->index = 0;
        }));
  Write(dir, "shape_mismatch" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[1]->shape = {4, 7};
        }));
  Write(dir, "rank_too_high" + invalid,
        Module(add, [](ModuleT* m) { m->functions[0]->inputs[0]->shape.assign(12, 1); }));
  Write(dir, "size_bytes_mismatch" + invalid,
        Module(add, [](ModuleT* m) { m->functions[0]->outputs[0]->size_bytes = 129; }));
  Write(dir, "size_bytes_overflow" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->inputs[0]->shape = {1ll << 62, 8};
        }));
  Write(dir, "unknown_dtype" + unsupported,
        Module(add, [](ModuleT* m) { m->functions[0]->inputs[1]->dtype = 200; }));
  Write(dir, "unknown_segment" + unsupported, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->operands[1]->segment = 9;
        }));
  Write(dir, "unknown_opcode" + unsupported, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->opcode = 0x0799;
        }));
  Write(dir, "unknown_binary_fn" + unsupported, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->ints = {999};
        }));
  Write(dir, "wrong_engine_stream" + invalid,
        Module(add, [](ModuleT* m) { m->functions[0]->streams[0]->engine = TERN_ENGINE_DMA; }));
  Write(dir, "duplicate_stream" + invalid, Module(add, [](ModuleT* m) {
          auto& streams = m->functions[0]->streams;
          streams.push_back(std::make_unique<tern::format::StreamT>(*streams[0]));
        }));
  Write(dir, "duplicate_function" + invalid, Module(add, [](ModuleT* m) {
          m->functions.push_back(std::make_unique<tern::format::FunctionT>(*m->functions[0]));
        }));
  Write(dir, "duplicate_tensor_name" + invalid,
        Module(add, [](ModuleT* m) { m->functions[0]->inputs[1]->name = "x"; }));
  Write(dir, "debug_index_out_of_range" + invalid, Module(add, [](ModuleT* m) {
          m->functions[0]->streams[0]->instructions[0]->debug_op = 100;
        }));
  Write(dir, "deadlock_wait_too_high" + invalid, Module(pipeline, [](ModuleT* m) {
          for (auto& stream : m->functions[0]->streams) {
            for (auto& instruction : stream->instructions) {
              if (instruction->opcode == TERN_OP_SEM_WAIT) instruction->ints[1] = 5;
            }
          }
        }));
  Write(dir, "deadlock_no_signal" + invalid, Module(pipeline, [](ModuleT* m) {
          for (auto& stream : m->functions[0]->streams) {
            for (auto& instruction : stream->instructions) {
              if (instruction->opcode == TERN_OP_SEM_SIGNAL) instruction->ints[0] = 7;
            }
          }
        }));
  Write(dir, "sem_bad_increment" + invalid, Module(pipeline, [](ModuleT* m) {
          for (auto& stream : m->functions[0]->streams) {
            for (auto& instruction : stream->instructions) {
              if (instruction->opcode == TERN_OP_SEM_SIGNAL) instruction->ints[1] = -1;
            }
          }
        }));
}

}  // namespace

// Recomputes every checksum of IN (where its section table can be read) and
// writes OUT: how an input the fuzzer found (it fixes checksums before
// loading) becomes a regression corpus file that reaches the same check.
int FixChecksums(const char* in_path, const char* out_path) {
  std::ifstream in(in_path, std::ios::binary);
  Bytes data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() >= 64) {
    uint64_t table = 0;
    uint32_t count = 0, entry = 0;
    std::memcpy(&table, data.data() + 24, 8);
    std::memcpy(&count, data.data() + 32, 4);
    std::memcpy(&entry, data.data() + 36, 4);
    for (uint32_t i = 0; entry >= 32 && i < count && i < 4096; ++i) {
      const uint64_t at = table + uint64_t{i} * entry;
      if (at > data.size() || 32 > data.size() - at) break;
      uint64_t offset = 0, size = 0;
      std::memcpy(&offset, data.data() + at + 8, 8);
      std::memcpy(&size, data.data() + at + 16, 8);
      if (offset > data.size() || size > data.size() - offset) continue;
      const uint64_t checksum = exetest::Xxh3(data.data() + offset, size);
      std::memcpy(data.data() + at + 24, &checksum, 8);
    }
    uint32_t header_size = 0;
    std::memcpy(&header_size, data.data() + 12, 4);
    if (header_size >= 64 && header_size <= data.size()) exetest::FixHeaderChecksum(&data);
  }
  const std::string out(out_path);
  const size_t slash = out.rfind('/');
  Write(slash == std::string::npos ? "." : out.substr(0, slash),
        slash == std::string::npos ? out : out.substr(slash + 1), data);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--fix-checksums") == 0)
    return FixChecksums(argv[2], argv[3]);
  if (argc != 3 ||
      (std::strcmp(argv[1], "--valid") != 0 && std::strcmp(argv[1], "--malformed") != 0)) {
    std::fprintf(stderr, "usage: %s --valid|--malformed DIR\n       %s --fix-checksums IN OUT\n",
                 argv[0], argv[0]);
    return 2;
  }
  if (std::strcmp(argv[1], "--valid") == 0) {
    WriteValid(argv[2]);
  } else {
    WriteMalformed(argv[2]);
  }
  return 0;
}
