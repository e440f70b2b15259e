// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for authenticating the
// bootstrap and control connections of communicators (see "Security model"
// in docs/collectives.md). tern links no crypto library, and these two are
// all it needs: a keyed hash over a challenge proves knowledge of a
// communicator's secret without sending it. Checked against the FIPS and
// RFC 4231 test vectors (tests/comm/comm_sha256_test.cc). Depends on the
// standard library only.
#ifndef TERN_COLLECTIVES_SHA256_H_
#define TERN_COLLECTIVES_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tern::comm {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256. Thread-safety: one object per thread.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t bytes);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // The digest; the object must not be updated afterwards.
  Sha256Digest Finish();

 private:
  void Block(const uint8_t* block);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// SHA-256 of `data`. Thread-safety: safe from any thread.
Sha256Digest Sha256Of(std::string_view data);

// HMAC-SHA-256 of `message` under `key` (any length). Thread-safety: safe
// from any thread.
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

// Whether a[0, bytes) == b[0, bytes), in time that depends only on `bytes`
// (so that a peer cannot find a valid MAC byte by byte by timing replies).
// Thread-safety: safe from any thread.
bool ConstantTimeEqual(const void* a, const void* b, size_t bytes);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_SHA256_H_
