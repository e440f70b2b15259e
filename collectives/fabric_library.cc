#include "fabric_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <string>

#include "signal_disposition_guard.h"

namespace tern::comm {
namespace {

constexpr const char* kLibraryName = "libfabric.so.1";
constexpr uint32_t kMinimumVersion = FI_VERSION(1, 17);  // fabric_channel.cc asks for 1.17
constexpr const char* kInstall =
    "install libfabric 1.17 or newer (Debian/Ubuntu: apt install libfabric1; Fedora/RHEL: dnf "
    "install libfabric; on AWS the EFA installer provides it), or add the directory that holds "
    "libfabric.so.1 to LD_LIBRARY_PATH";

// Resolves `name` at `version` (what the linker records for a program built
// against libfabric >= 1.17), else at its default version (a libfabric built
// without symbol versions).
template <typename Function>
bool Resolve(void* handle, const char* name, const char* version, Function* out) {
  void* symbol = dlvsym(handle, name, version);
  if (symbol == nullptr) symbol = dlsym(handle, name);
  *out = reinterpret_cast<Function>(symbol);
  return symbol != nullptr;
}

// Where the loaded library lies, for messages.
std::string LoadedPath(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return kLibraryName;
}

Status Load(FabricLibrary* lib) {
  const char* chosen = std::getenv("TERN_COMM_LIBFABRIC");
  const bool overridden = chosen != nullptr && *chosen != '\0';
  const char* name = overridden ? chosen : kLibraryName;
  void* handle = nullptr;
  {
    // Library constructors run here: keep the program's signal handling.
    SignalDispositionGuard keep_signals;
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    const char* why = dlerror();
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "this communicator reaches ranks of other processes through libfabric, "
                      "but {}{} could not be loaded ({}); {}{}",
                      name, overridden ? " (TERN_COMM_LIBFABRIC)" : "",
                      why != nullptr ? why : "unknown reason", kInstall,
                      overridden ? ", or unset TERN_COMM_LIBFABRIC" : "");
  }
  const std::string path = LoadedPath(handle);
  const bool resolved = Resolve(handle, "fi_version", "FABRIC_1.0", &lib->version) &&
                        Resolve(handle, "fi_getinfo", "FABRIC_1.3", &lib->getinfo) &&
                        Resolve(handle, "fi_freeinfo", "FABRIC_1.3", &lib->freeinfo) &&
                        Resolve(handle, "fi_dupinfo", "FABRIC_1.3", &lib->dupinfo) &&
                        Resolve(handle, "fi_fabric", "FABRIC_1.1", &lib->fabric) &&
                        Resolve(handle, "fi_strerror", "FABRIC_1.0", &lib->strerror);
  if (!resolved) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "{} is not a usable libfabric: it lacks fi_version, fi_getinfo, "
                      "fi_freeinfo, fi_dupinfo, fi_fabric or fi_strerror; {}",
                      path, kInstall);
  }
  const uint32_t version = lib->version();
  if (version < kMinimumVersion) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "{} is libfabric {}.{}, older than the 1.17 tern needs; {}", path,
                      FI_MAJOR(version), FI_MINOR(version), kInstall);
  }
  return OkStatus();
}

}  // namespace

Status FabricLibrary::Get(const FabricLibrary** out) {
  static FabricLibrary library;
  static const Status loaded = Load(&library);  // once; C++ makes concurrent callers wait
  *out = loaded.ok() ? &library : nullptr;
  return loaded;
}

}  // namespace tern::comm
