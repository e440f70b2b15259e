// tern-dump: prints an executable's header, sections, signature and
// disassembly, then whether tern would load it.
//   tern-dump [--summary] FILE
// Exit status: 0 accepted, 1 rejected by the loader, 2 usage or I/O error.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "src/executable/dump.h"

int main(int argc, char** argv) {
  tern::exe::DumpOptions options;
  const char* path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--summary") == 0) {
      options.disassemble = false;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf("usage: %s [--summary] FILE\n", argv[0]);
      return 0;
    } else if (path == nullptr) {
      path = argv[i];
    } else {
      std::fprintf(stderr, "usage: %s [--summary] FILE\n", argv[0]);
      return 2;
    }
  }
  if (path == nullptr) {
    std::fprintf(stderr, "usage: %s [--summary] FILE\n", argv[0]);
    return 2;
  }
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::fprintf(stderr, "tern-dump: cannot open '%s': %s\n", path, std::strerror(errno));
    return 2;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  void* mapping = nullptr;
  if (size > 0) {
    mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      std::fprintf(stderr, "tern-dump: cannot map '%s': %s\n", path, std::strerror(errno));
      return 2;
    }
    data = static_cast<const uint8_t*>(mapping);
  }
  close(fd);
  std::string text;
  tern::Status status = tern::exe::DumpExecutable({data, size}, &text, options);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (mapping != nullptr) munmap(mapping, size);
  return status.ok() ? 0 : 1;
}
