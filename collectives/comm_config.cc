#include "comm_config.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "src/runtime/api_checks.h"

namespace tern::comm {
namespace {

Status ReadSeconds(const char* name, uint64_t* out_ns) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return OkStatus();
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || seconds > 1e7) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{}='{}' is not a number of seconds > 0 (e.g. 300 or 2.5)", name, text);
  }
  *out_ns = static_cast<uint64_t>(std::llround(seconds * 1e9));
  return OkStatus();
}

Status ReadBytes(const char* name, uint64_t minimum, uint64_t* out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return OkStatus();
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (end != text) {
    if (*end == 'K' || *end == 'k')
      value <<= 10, ++end;
    else if (*end == 'M' || *end == 'm')
      value <<= 20, ++end;
    else if (*end == 'G' || *end == 'g')
      value <<= 30, ++end;
  }
  if (end == text || *end != '\0' || value < minimum) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{}='{}' is not a byte count >= {} (digits with an optional K, M or G)", name,
                      text, minimum);
  }
  *out = value;
  return OkStatus();
}

// A switch: "0" or "1"; unset or empty leaves *out as it is.
Status ReadSwitch(const char* name, bool* out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return OkStatus();
  if (std::strcmp(text, "0") == 0) {
    *out = false;
  } else if (std::strcmp(text, "1") == 0) {
    *out = true;
  } else {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{}='{}' must be 0 or 1", name, text);
  }
  return OkStatus();
}

}  // namespace

Status LoadConfig(const tern_comm_config_t* config, CommConfig* out) {
  CommConfig c;
  TERN_RETURN_IF_ERROR(ReadSeconds("TERN_COMM_TIMEOUT", &c.timeout_ns));
  TERN_RETURN_IF_ERROR(ReadSeconds("TERN_COMM_INIT_TIMEOUT", &c.init_timeout_ns));
  TERN_RETURN_IF_ERROR(ReadBytes("TERN_COMM_ALLREDUCE_RD_MAX", 0, &c.allreduce_rd_max));
  TERN_RETURN_IF_ERROR(ReadBytes("TERN_COMM_ALLREDUCE_RING_MIN", 0, &c.allreduce_ring_min));
  TERN_RETURN_IF_ERROR(ReadBytes("TERN_COMM_ALLGATHER_RD_MAX", 0, &c.allgather_rd_max));
  TERN_RETURN_IF_ERROR(ReadBytes("TERN_COMM_TREE_MAX", 0, &c.tree_max));
  TERN_RETURN_IF_ERROR(ReadBytes("TERN_COMM_CHUNK", 64, &c.chunk_bytes));
  if (const char* algo = std::getenv("TERN_COMM_ALLREDUCE_ALGO");
      algo != nullptr && *algo != '\0') {
    if (std::strcmp(algo, "auto") == 0)
      c.allreduce_algo = AllReduceAlgo::kAuto;
    else if (std::strcmp(algo, "rd") == 0)
      c.allreduce_algo = AllReduceAlgo::kRecursiveDoubling;
    else if (std::strcmp(algo, "rabenseifner") == 0)
      c.allreduce_algo = AllReduceAlgo::kRabenseifner;
    else if (std::strcmp(algo, "ring") == 0)
      c.allreduce_algo = AllReduceAlgo::kRing;
    else {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_COMM_ALLREDUCE_ALGO='{}' is not one of auto, rd, rabenseifner, ring",
                        algo);
    }
  }
  TERN_RETURN_IF_ERROR(ReadSwitch("TERN_COMM_SHM", &c.use_shm));
  TERN_RETURN_IF_ERROR(ReadBytes("TERN_COMM_DIRECT_MIN", 0, &c.direct_min));
  TERN_RETURN_IF_ERROR(ReadSwitch("TERN_COMM_DIRECT", &c.use_direct));
  if (config != nullptr) {
    if (config->struct_size < sizeof(tern_comm_config_t)) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "tern_comm_config_t.struct_size is {} but this version needs at least {}: "
                        "set it to sizeof(tern_comm_config_t)",
                        config->struct_size, sizeof(tern_comm_config_t));
    }
    TERN_RETURN_IF_ERROR(CheckNoFlags(config->flags, "tern_comm_config_t"));
    if (config->timeout_ns != 0) c.timeout_ns = config->timeout_ns;
    if (config->init_timeout_ns != 0) c.init_timeout_ns = config->init_timeout_ns;
  }
  c.stall_check_ns =
      std::min<uint64_t>(1000000000ull, std::max<uint64_t>(c.timeout_ns / 8, 1000000ull));
  *out = c;
  return OkStatus();
}

}  // namespace tern::comm
