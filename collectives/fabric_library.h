// FabricLibrary: libfabric, loaded at run time the first time a fabric
// channel is opened, never at program start.
//
// libtern does not link libfabric: a program that never creates a
// communicator reaching another process through libfabric never loads it, so
// neither its providers' constructors (libinfinipath installs crash handlers
// before main) nor their threads and memory hooks reach the host program.
// When it is loaded, SignalDispositionGuard puts back the signal handling
// the program had.
//
// Only a few fi_* functions are real symbols of libfabric; the others
// (fi_domain, fi_endpoint, fi_tsend, fi_cq_read, fi_close, ...) are inline
// wrappers over the operation tables of the objects these return, so they
// need no symbol. Each one is resolved at the symbol version a link against
// libfabric >= 1.17 records, as the dynamic linker would.
#ifndef TERN_COLLECTIVES_FABRIC_LIBRARY_H_
#define TERN_COLLECTIVES_FABRIC_LIBRARY_H_

#include <rdma/fabric.h>

#include "common/status_with_message.h"

namespace tern::comm {

struct FabricLibrary {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;  // dupinfo(nullptr) is fi_allocinfo()
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;
  decltype(&::fi_version) version = nullptr;

  // Loads libfabric (TERN_COMM_LIBFABRIC, a file name or path, else
  // libfabric.so.1, found as the dynamic linker finds any library:
  // LD_LIBRARY_PATH, the ld.so cache) the first time, and gives the
  // same library every later time; it is never unloaded. Fails with
  // TERN_ERROR_COMM_TRANSPORT naming the library, why it could not be used
  // and what to install; the failure is remembered (one attempt per process).
  // Thread-safety: any thread; concurrent first calls load it once.
  static Status Get(const FabricLibrary** out);
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_FABRIC_LIBRARY_H_
