// The secret of a communicator: 256 bits from the kernel's random source
// (getrandom), known to its ranks and to nobody else. Every bootstrap join
// and every control connection proves knowledge of it with an HMAC-SHA-256
// over a fresh challenge of the other end (Prove), so the secret itself
// never crosses the network. Where it comes from: the unique id
// (tern_comm_get_unique_id), TERN_COMM_SECRET or TERN_COMM_SECRET_FILE
// (tern_comm_init_from_env), else a file that rank 0 writes for the ranks of
// its host, readable by this user only; split derives a child's secret from
// its parent's. See "Security model" in docs/collectives.md.
#ifndef TERN_COLLECTIVES_SECRET_H_
#define TERN_COLLECTIVES_SECRET_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/status_with_message.h"
#include "sha256.h"

namespace tern::comm {

struct Secret {
  std::array<uint8_t, 32> bytes{};
  std::string_view view() const {
    return std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
};

// The fresh random bytes each side of a handshake sends the other.
constexpr size_t kChallengeBytes = 16;

// Fills `out` from getrandom(2). Thread-safety: safe from any thread.
Status RandomBytes(void* out, size_t bytes);
// A new random secret. Thread-safety: safe from any thread.
Status GenerateSecret(Secret* out);
// A new random challenge (kChallengeBytes). Thread-safety: safe from any thread.
Status NewChallenge(std::string* out);

// The secret named by the environment: TERN_COMM_SECRET (at least 32 hex
// digits, 128 bits), else the file TERN_COMM_SECRET_FILE names (the same
// text; owned by this user and not readable by others). `*out_found` is
// false when neither is set. Thread-safety: safe from any thread.
Status SecretFromEnvironment(bool* out_found, Secret* out);

// Where rank 0 of tern_comm_init_from_env leaves the secret it generated for
// the ranks of its host when the environment names none:
// $XDG_RUNTIME_DIR/tern-comm, else /tmp/tern-comm-<uid>, a folder of this
// user's only; one file per bootstrap address. Thread-safety: safe from any
// thread.
std::string HostSecretPath(std::string_view bootstrap_address);
// Writes (replaces) and reads that file, refusing a folder or file another
// user owns or could read. Thread-safety: safe from any thread.
Status WriteHostSecret(const std::string& path, const Secret& secret);
Status ReadHostSecret(const std::string& path, Secret* out);

// The proof of knowledge of `secret` for one purpose ("join", "table",
// "ctrl", ...) over the given parts (challenges, the message): HMAC-SHA-256
// of the purpose and the length-prefixed parts. Thread-safety: safe from
// any thread.
Sha256Digest Prove(const Secret& secret, std::string_view purpose,
                   std::initializer_list<std::string_view> parts);
// Whether `mac` (received) is the proof Prove() computes; constant time.
// Thread-safety: safe from any thread.
bool ProofMatches(const Sha256Digest& expected, std::string_view mac);

// A child communicator's secret (split): a keyed hash of the parent's
// secret and a random salt, so that only the salt travels. Thread-safety:
// safe from any thread.
Secret DeriveSecret(const Secret& parent, std::string_view salt);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_SECRET_H_
