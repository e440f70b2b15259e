// `tern dump FILE`: the executable inspector. Prints the header, sections
// (with their checksums checked), signature and the disassembly of every
// instruction stream, then whether the loader would accept the file.
//
// Unlike the other subcommands it needs no device: it reads the file with
// tern's executable library (src/executable/dump.h), the same code the
// loader uses, so it can inspect a file that tern would refuse.
#include "src/executable/dump.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "subcommands.h"
#include "util.h"

namespace tern::tools {
namespace {

// Exit status of a file that the loader would reject (1, as `tern diag`
// uses for "degraded": the file was read, and it is not usable).
constexpr int kExitRejected = 1;

// A read-only mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw ToolError("cannot open '" + path + "': " + std::strerror(errno) +
                      "; give the path of an executable file");
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const std::string why = S_ISDIR(st.st_mode) ? "it is a directory" : std::strerror(errno);
      close(fd);
      throw ToolError("cannot read '" + path + "': " + why +
                      "; give the path of an executable file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* mapping = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (mapping == MAP_FAILED) {
        const int error = errno;
        close(fd);
        throw ToolError("cannot map '" + path + "': " + std::strerror(error));
      }
      data_ = static_cast<const uint8_t*>(mapping);
    }
    close(fd);
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

Runner AddDumpOptions(CLI::App* app) {
  struct Options {
    std::string file;
    bool summary = false;
  };
  auto options = std::make_shared<Options>();
  app->add_option("FILE", options->file, "The executable to inspect")->required();
  app->add_flag("--summary", options->summary,
                "Header, sections and signature only: no disassembly");
  return [options]() -> int {
    const MappedFile file(options->file);
    exe::DumpOptions dump_options;
    dump_options.disassemble = !options->summary;
    std::string text;
    const Status verdict = exe::DumpExecutable(file.bytes(), &text, dump_options);
    std::cout << text;
    std::cout.flush();
    if (!verdict.ok()) {
      std::cerr << "tern dump: " << options->file << " would not load: " << verdict.message()
                << "\n";
      return kExitRejected;
    }
    return kExitOk;
  };
}

}  // namespace tern::tools
