// The two public functions of libtern that the compiler's IR calls,
// tern_dtype_size() and tern_dtype_name(), for the standalone fuzz build
// (fuzz/CMakeLists.txt), which does not build libtern: the same answers, from
// the same ISA rules in common/ that libtern's definitions use.
#include "common/isa_rules.h"
#include "tern/isa.h"

uint64_t tern_dtype_size(tern_dtype_t dtype) { return tern::isa::DTypeSize(dtype); }

const char* tern_dtype_name(tern_dtype_t dtype) { return tern::isa::DTypeName(dtype); }
