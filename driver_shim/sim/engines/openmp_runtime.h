// The calls tern makes into the OpenMP runtime that oneDNN runs on
// (the system's oneDNN uses GCC's libgomp), declared here instead of
// through <omp.h>: with clang, <omp.h> and -fopenmp belong to LLVM's libomp,
// whose omp_set_num_threads would set the threads of a second runtime that
// oneDNN never reads, and every process would load both. The build links
// libgomp itself (CMakeLists.txt, tern_openmp).
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_OPENMP_RUNTIME_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_OPENMP_RUNTIME_H_

extern "C" {
// Thread-safety: as OpenMP defines them; each acts on the calling thread's
// settings.
int omp_get_max_threads(void);
void omp_set_num_threads(int threads);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
}

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_OPENMP_RUNTIME_H_
