// Helpers of the executable tests: small executables built through the public
// builder API, and an independent implementation of the container
// (docs/executable-format.md) that decodes a file, lets a test change any
// part of it, and writes it back with correct checksums. Crafting bad files
// this way checks the loader against the spec, not against its own writer.
#ifndef TERN_TESTS_EXECUTABLE_EXE_TEST_UTIL_H_
#define TERN_TESTS_EXECUTABLE_EXE_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/executable/tern_executable_generated.h"
#include "tern/builder.h"
#include "tern/executable.h"
#include "tern/tern.h"

namespace exetest {

using Bytes = std::vector<uint8_t>;

inline constexpr uint32_t kModule = 1;
inline constexpr uint32_t kConstants = 2;
inline constexpr uint32_t kDebug = 3;
inline constexpr uint32_t kOptional = 1;

struct Section {
  uint32_t kind = 0;
  uint32_t flags = 0;
  Bytes bytes;
};

struct Image {
  uint16_t major = 1;
  uint16_t minor = 0;
  uint64_t required_features = 0;
  uint64_t optional_features = 0;
  uint32_t extra_header_bytes = 0;  // a "newer minor" header longer than 64
  uint32_t extra_entry_bytes = 0;   // a "newer minor" section entry longer than 32
  std::vector<Section> sections;

  Section* Find(uint32_t kind);
};

// Decodes a well-formed container (fails the test otherwise).
Image Decode(const Bytes& data);
// Encodes per the spec: MODULE/DEBUG/unknown at 8-byte multiples, CONSTANTS
// at 4096 multiples, every checksum right.
Bytes Encode(const Image& image);
// Recomputes the header checksum of `data` in place (after editing fields).
void FixHeaderChecksum(Bytes* data);
// Recomputes section `index`'s checksum and then the header checksum.
void FixSectionChecksum(Bytes* data, uint32_t index);

uint64_t Xxh3(const uint8_t* data, size_t size);

std::unique_ptr<tern::format::ModuleT> UnpackModule(const Image& image);
void PackModule(const tern::format::ModuleT& module, Image* image);
std::unique_ptr<tern::format::DebugInfoT> UnpackDebug(const Image& image);
void PackDebug(const tern::format::DebugInfoT& debug, Image* image);

// Applies `edit` to the module of `data` and re-encodes.
template <typename Edit>
Bytes EditModule(const Bytes& data, Edit edit) {
  Image image = Decode(data);
  auto module = UnpackModule(image);
  edit(module.get());
  PackModule(*module, &image);
  return Encode(image);
}

// Builder helpers (public API). Each ASSERTs success through gtest.
tern_operand_t Tensor(tern_segment_t segment, uint32_t index, tern_dtype_t dtype, uint32_t rank,
                      const int64_t* shape, uint64_t offset = 0);

// One function "add": out 'z' = 'x' + 'y', f32 [4, 8], with the debug op
// "aten::add". Optionally reads 'y' from 128 bytes of constants instead
// (then it has one input).
Bytes BuildAdd(bool y_from_constants = false);

// One function "fused" using both fusion extensions of the ISA: z = x * y + 1
// as an ELEMENTWISE program (Vector) and w = relu(x @ y^T) as a MATMUL with an
// activation (Tensor); x, y f32 [4, 8], z [4, 8], w [4, 4]. Its header has
// both feature bits.
Bytes BuildFused();
// One function "order": cumsum = scan sum of input x [4, 8] f32 along axis 1,
// then the top 3 of x along axis 1 into values [4, 3] f32 and indices i64.
Bytes BuildScanTopk();
// One function "assign": output y [5, 3] f32 is updated in place by a scatter
// of input src [4, 3] f32 at input rows i64 [4] along axis 0, then a
// scatter_along_axis of input src2 [2, 3] f32 at input index2 i64 [2, 3]
// along axis 0. Its header has the feature bit scatter.
Bytes BuildScatter();

// One function "matmul": output 'out' [rows, cols] = input 'a' [rows, k] @
// input 'b' [k, cols], f32.
Bytes BuildMatmul(int64_t rows, int64_t k, int64_t cols);

// One function "pipeline" with 2 streams ordered by a semaphore: the DMA
// engine copies input 'x' to scratch and signals semaphore 0; the vector
// engine waits for it and writes out 'y' = scratch + scratch (f32 [16]).
// Without the semaphore the two engines race on the scratch.
Bytes BuildPipeline(bool with_semaphore = true);

// The race corpus: small programs on 'x' (input, f32 [16]), 'y' (output,
// f32 [16]) and 64 bytes of scratch whose DMA, vector and scalar streams
// race (`race` names the kind the loader must report) or are ordered,
// through semaphores or because their strided views interleave (`race` is
// nullptr). Racy ones are built with TERN_BUILDER_ALLOW_RACES.
struct HazardProgram {
  const char* name;  // "race_write_after_read", "ordered_chain_through_third_engine"
  const char* race;  // "write-after-read", or nullptr
  Bytes bytes;
};
std::vector<HazardProgram> HazardCorpus();

// Writes `data` to a file under the test's temporary directory; returns path.
std::string WriteTemp(const std::string& name, const Bytes& data);

// tern_last_error_message() as a std::string.
std::string LastError();

}  // namespace exetest

#endif  // TERN_TESTS_EXECUTABLE_EXE_TEST_UTIL_H_
