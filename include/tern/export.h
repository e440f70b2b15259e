/* tern — symbol visibility and the shared definitions every header needs. */
#ifndef TERN_EXPORT_H_
#define TERN_EXPORT_H_

#include <stdint.h>

#if defined(TERN_BUILDING_LIBRARY) && defined(__GNUC__)
#define TERN_API __attribute__((visibility("default")))
#else
#define TERN_API
#endif

/* The API's enums. A C program may pass or store any 32-bit value where an enum
 * is expected, and tern checks it. C++ gives an enum without a fixed underlying
 * type only the values its enumerators need, and loading any other value is
 * undefined there; so in C++ these enums are based on int32_t, which holds
 * every value C can pass and promotes as such an enum did before. The size and
 * the calling convention are those of C's enum. */
#ifdef __cplusplus
#define TERN_ENUM_BASE : int32_t
#else
#define TERN_ENUM_BASE
#endif

/* Waits that take a timeout in nanoseconds use this for "wait forever". */
#define TERN_TIMEOUT_INFINITE UINT64_MAX

#endif /* TERN_EXPORT_H_ */
