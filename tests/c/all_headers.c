/* Compiled as C99 with -Wall -Wextra -Werror -pedantic by the build: every
 * public header must be valid C on its own and through the umbrella. */
#include "tern/builder.h"
#include "tern/comm.h"
#include "tern/debug.h"
#include "tern/device.h"
#include "tern/event.h"
#include "tern/executable.h"
#include "tern/export.h"
#include "tern/graph.h"
#include "tern/io_set.h"
#include "tern/isa.h"
#include "tern/memory.h"
#include "tern/memory_pool.h"
#include "tern/profile.h"
#include "tern/queue.h"
#include "tern/runtime.h"
#include "tern/status.h"
#include "tern/telemetry.h"
#include "tern/tern.h"
#include "tern/types.h"
#include "tern/version.h"

int tern_c99_header_check(void);
int tern_c99_header_check(void) {
  tern_buffer_params_t params = {sizeof(tern_buffer_params_t), 0, 4096, 0, TERN_MEMORY_TENSORS};
  return (int)params.size + TERN_VERSION;
}
