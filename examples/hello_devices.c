/* hello_devices: the first tern program to read.
 *
 * It starts the runtime, lists every device this process can see and what
 * the node is doing with it, and shuts the runtime down again. It only reads:
 * it opens no core and allocates nothing, so it runs happily next to other
 * programs that are using the devices.
 *
 * Build: link against libtern (pkg-config tern, or find_package(tern) and
 * target_link_libraries(... tern::tern)).
 * Run:   ./hello_devices
 *        TERN_SIM_TOPOLOGY=4x2x1G ./hello_devices   (a different simulated node)
 *
 * Exit status: 0 on success, 1 when a tern call failed (the message says
 * which and why), 2 when the runtime started but no device is visible.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <tern/tern.h>

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_NO_DEVICE = 2 };

/* Every tern call returns a status; on failure the calling thread also gets a
 * message that says what failed, why, and what to do. This prints both and
 * returns 1 so that callers can write `if (failed(...)) goto out;`. */
static int failed(tern_status_t status, const char* what) {
  const char* name;
  const char* message;
  if (status == TERN_OK) return 0;
  /* Read the message last: it stays valid only until the next tern call on
   * this thread, and tern_status_string() is a tern call too. */
  name = tern_status_string(status);
  message = tern_last_error_message();
  fprintf(stderr, "hello_devices: %s failed with %s\n  %s\n", what, name, message);
  return 1;
}

/* Byte counts read better in binary units: "8.00 GiB". */
static void format_bytes(uint64_t bytes, char* out, size_t out_size) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = (double)bytes;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) {
    snprintf(out, out_size, "%llu B", (unsigned long long)bytes);
  } else {
    snprintf(out, out_size, "%.2f %s", value, units[unit]);
  }
}

/* Prints one device. Returns 0, or 1 after reporting a failed call. */
static int print_device(uint32_t index) {
  tern_device_t device;
  tern_device_info_t info;
  tern_memory_stats_t stats;
  tern_device_telemetry_t telemetry;
  char capacity[32], used[32], free_bytes[32];
  uint32_t core;

  if (failed(tern_device_get(index, &device), "tern_device_get")) return 1;

  /* Structs that may grow in later versions start with struct_size: it
   * tells the library which version of the struct this program knows. */
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  if (failed(tern_device_get_info(device, &info), "tern_device_get_info")) return 1;

  /* Memory statistics cover the whole node: other processes using the same
   * device show up in node_used_bytes, not only this one. */
  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  if (failed(tern_device_memory_stats(device, &stats), "tern_device_memory_stats")) return 1;

  format_bytes(info.memory_bytes, capacity, sizeof(capacity));
  format_bytes(stats.node_used_bytes, used, sizeof(used));
  format_bytes(stats.free_bytes, free_bytes, sizeof(free_bytes));

  printf("device %u: %s (driver %s, physical index %u)\n", info.index, info.name, info.driver,
         info.physical_index);
  printf("  cores:         %u visible of %u\n", info.core_count, info.physical_core_count);
  printf("  HBM:           %s, %s in use on the node, %s free\n", capacity, used, free_bytes);
  /* NUMA placement matters for host-device copies: pin the threads that feed
   * a device to the CPUs listed here. Either may be unknown. */
  if (info.numa_node >= 0) {
    printf("  NUMA node:     %d\n", info.numa_node);
  } else {
    printf("  NUMA node:     unknown\n");
  }
  printf("  CPU affinity:  %s\n", info.cpu_affinity[0] != '\0' ? info.cpu_affinity : "unknown");

  /* Telemetry is readable without owning anything; it says who holds each
   * core, which explains a TERN_ERROR_BUSY from tern_core_open(). The struct
   * is large, and zeroing it keeps a partial answer from printing garbage. */
  memset(&telemetry, 0, sizeof(telemetry));
  telemetry.struct_size = sizeof(telemetry);
  if (failed(tern_device_get_telemetry(device, &telemetry), "tern_device_get_telemetry")) return 1;
  for (core = 0; core < telemetry.core_count && core < TERN_TELEMETRY_MAX_CORES; ++core) {
    const tern_core_telemetry_t* c = &telemetry.cores[core];
    if (c->owner_pid != 0) {
      printf("  core %u:        owned by pid %d (%s), %llu commands run\n", c->physical_index,
             (int)c->owner_pid, c->owner_command, (unsigned long long)c->commands);
    } else {
      printf("  core %u:        free, %llu commands run\n", c->physical_index,
             (unsigned long long)c->commands);
    }
  }
  return 0;
}

int main(void) {
  tern_version_t version;
  uint32_t count = 0;
  uint32_t i;
  int exit_code = EXIT_OK;

  /* The version query works before tern_init(): it describes the library
   * that was actually loaded, which may be newer than the headers. */
  memset(&version, 0, sizeof(version));
  version.struct_size = sizeof(version);
  if (failed(tern_get_version(&version), "tern_get_version")) return EXIT_TERN_FAILED;

  /* NULL options: the driver comes from TERN_DRIVER, "sim" by default. */
  if (failed(tern_init(NULL), "tern_init")) return EXIT_TERN_FAILED;

  printf("tern %u.%u.%u (%s), driver \"%s\"\n", version.major, version.minor, version.patch,
         version.build != NULL ? version.build : "", tern_driver_name());

  if (failed(tern_device_count(&count), "tern_device_count")) {
    exit_code = EXIT_TERN_FAILED;
  } else if (count == 0) {
    fprintf(stderr, "hello_devices: no device is visible (check TERN_VISIBLE_CORES)\n");
    exit_code = EXIT_NO_DEVICE;
  } else {
    printf("%u device%s\n", count, count == 1 ? "" : "s");
    for (i = 0; i < count; ++i) {
      if (print_device(i) != 0) {
        exit_code = EXIT_TERN_FAILED;
        break;
      }
    }
  }

  /* Every successful tern_init() needs one tern_shutdown(), failure or not. */
  if (failed(tern_shutdown(), "tern_shutdown")) exit_code = EXIT_TERN_FAILED;
  return exit_code;
}
