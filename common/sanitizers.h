// Which sanitizer this file is compiled under, for GCC and clang alike: GCC
// defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__, clang (14) neither and
// answers __has_feature instead. TERN_UNDER_ASAN / TERN_UNDER_TSAN are 1 or 0.
#ifndef TERN_COMMON_SANITIZERS_H_
#define TERN_COMMON_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define TERN_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TERN_UNDER_ASAN 1
#endif
#endif
#ifndef TERN_UNDER_ASAN
#define TERN_UNDER_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define TERN_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TERN_UNDER_TSAN 1
#endif
#endif
#ifndef TERN_UNDER_TSAN
#define TERN_UNDER_TSAN 0
#endif

#endif  // TERN_COMMON_SANITIZERS_H_
