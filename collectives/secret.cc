#include "secret.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tern::comm {
namespace {

constexpr size_t kMinSecretHexDigits = 32;  // 128 bits
constexpr size_t kMaxSecretText = 4096;

// Decodes hex text (surrounding white space ignored) into the secret: the
// SHA-256 of the decoded bytes, so any length of at least 128 bits works.
Status ParseSecretText(std::string_view text, std::string_view source, Secret* out) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  bool hex = text.size() % 2 == 0;
  for (char c : text) hex = hex && digit(c) >= 0;
  if (!hex || text.size() < kMinSecretHexDigits) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} must be an even number of at least {} hex digits (128 bits; it has {} "
                      "characters{}): generate one with 'openssl rand -hex 32' or 'od -An -tx1 "
                      "-N32 /dev/urandom | tr -d \" \\n\"' and give every rank the same value",
                      source, kMinSecretHexDigits, text.size(), hex ? "" : ", not all hex digits");
  }
  std::string bytes(text.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(digit(text[2 * i]) * 16 + digit(text[2 * i + 1]));
  }
  const Sha256Digest digest = Sha256Of(bytes);
  std::memcpy(out->bytes.data(), digest.data(), digest.size());
  return OkStatus();
}

// Reads a secret file that only this user can read.
Status ReadPrivateFile(const std::string& path, std::string_view what, std::string* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(TERN_ERROR_INVALID_ARGUMENT, errno, fmt::format("open {}", what));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    close(fd);
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} is not a regular file of this user (uid {}) that only it can read: "
                      "chmod 600 it (a secret others can read authenticates nobody)",
                      what, geteuid());
  }
  char buffer[kMaxSecretText];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  const int err = errno;
  close(fd);
  if (n < 0) return ErrnoStatus(TERN_ERROR_IO, err, fmt::format("read {}", what));
  out->assign(buffer, static_cast<size_t>(n));
  return OkStatus();
}

std::string Hex(const Secret& secret) {
  std::string text;
  for (uint8_t b : secret.bytes) text += fmt::format("{:02x}", b);
  return text;
}

}  // namespace

Status RandomBytes(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    const ssize_t n = getrandom(p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(TERN_ERROR_IO, errno, "getrandom (the kernel's random source)");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status GenerateSecret(Secret* out) { return RandomBytes(out->bytes.data(), out->bytes.size()); }

Status NewChallenge(std::string* out) {
  out->assign(kChallengeBytes, '\0');
  return RandomBytes(out->data(), out->size());
}

Status SecretFromEnvironment(bool* out_found, Secret* out) {
  *out_found = false;
  if (const char* text = std::getenv("TERN_COMM_SECRET"); text != nullptr && *text != '\0') {
    *out_found = true;
    return ParseSecretText(text, "TERN_COMM_SECRET", out);
  }
  if (const char* path = std::getenv("TERN_COMM_SECRET_FILE"); path != nullptr && *path != '\0') {
    *out_found = true;
    const std::string what = fmt::format("TERN_COMM_SECRET_FILE {}", path);
    std::string text;
    TERN_RETURN_IF_ERROR(ReadPrivateFile(path, what, &text));
    return ParseSecretText(text, what, out);
  }
  return OkStatus();
}

std::string HostSecretPath(std::string_view bootstrap_address) {
  std::string folder;
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] == '/') {
    folder = fmt::format("{}/tern-comm", runtime_dir);
  } else {
    folder = fmt::format("/tmp/tern-comm-{}", geteuid());
  }
  std::string name;
  for (char c : bootstrap_address) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return fmt::format("{}/{}.secret", folder, name);
}

Status WriteHostSecret(const std::string& path, const Secret& secret) {
  const std::string folder = path.substr(0, path.rfind('/'));
  if (mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("mkdir {}", folder));
  }
  struct stat st {};
  if (lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} is not a folder of this user (uid {}) closed to others, so rank 0 "
                      "cannot leave the communicator's secret there: remove it, or set "
                      "TERN_COMM_SECRET to the same value on every rank",
                      folder, geteuid());
  }
  const std::string temporary = fmt::format("{}.{}", path, getpid());
  const int fd =
      open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("create {}", temporary));
  const std::string text = Hex(secret) + "\n";
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  close(fd);
  if (!written || rename(temporary.c_str(), path.c_str()) != 0) {
    const int rename_err = written ? errno : err;
    unlink(temporary.c_str());
    return ErrnoStatus(TERN_ERROR_IO, rename_err, fmt::format("write {}", path));
  }
  return OkStatus();
}

Status ReadHostSecret(const std::string& path, Secret* out) {
  std::string text;
  TERN_RETURN_IF_ERROR(ReadPrivateFile(path, path, &text));
  return ParseSecretText(text, path, out);
}

Sha256Digest Prove(const Secret& secret, std::string_view purpose,
                   std::initializer_list<std::string_view> parts) {
  std::string message = fmt::format("tern-comm/{}", purpose);
  for (std::string_view part : parts) {
    const uint32_t length = static_cast<uint32_t>(part.size());
    message.append(reinterpret_cast<const char*>(&length), sizeof(length));
    message.append(part);
  }
  return HmacSha256(secret.view(), message);
}

bool ProofMatches(const Sha256Digest& expected, std::string_view mac) {
  // The length is public (always 32); only the contents are compared in
  // constant time.
  if (mac.size() != expected.size()) return false;
  return ConstantTimeEqual(expected.data(), mac.data(), expected.size());
}

Secret DeriveSecret(const Secret& parent, std::string_view salt) {
  const Sha256Digest digest = Prove(parent, "split", {salt});
  Secret child;
  std::memcpy(child.bytes.data(), digest.data(), digest.size());
  return child;
}

}  // namespace tern::comm
