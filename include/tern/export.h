/* tern — symbol visibility and the shared definitions every header needs. */
#ifndef TERN_EXPORT_H_
#define TERN_EXPORT_H_

#if defined(TERN_BUILDING_LIBRARY) && defined(__GNUC__)
#define TERN_API __attribute__((visibility("default")))
#else
#define TERN_API
#endif

/* Waits that take a timeout in nanoseconds use this for "wait forever". */
#define TERN_TIMEOUT_INFINITE UINT64_MAX

#endif /* TERN_EXPORT_H_ */
