/* Links against an installed libtern and checks headers and library agree. */
#include <stdio.h>
#include <tern/tern.h>

int main(void) {
  tern_version_t version = {sizeof(version), 0, 0, 0, NULL};
  if (tern_get_version(&version) != TERN_OK) return 1;
  if (version.major != TERN_VERSION_MAJOR || version.minor < TERN_VERSION_MINOR) return 2;
  printf("tern %u.%u.%u\n", version.major, version.minor, version.patch);
  return 0;
}
