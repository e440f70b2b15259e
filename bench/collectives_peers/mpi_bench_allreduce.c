/* The Open MPI side of scripts/bench-collectives.sh: MPI_Allreduce of
 * floats (sum) timed like tern_bench_collectives (-n operations back to
 * back after -w warm-up ones, the slowest rank's mean time), printing the
 * same CSV rows. In-place (MPI_IN_PLACE) and out-of-place.
 *   mpirun -np 2 mpi_bench_allreduce [-b BYTES] [-e BYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double parse_bytes(const char* text) {
  char* end = NULL;
  double v = strtod(text, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return v;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double min_bytes = 8, max_bytes = 64.0 * 1024 * 1024, factor = 2;
  int iters = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b"))
      min_bytes = parse_bytes(argv[i + 1]);
    else if (!strcmp(argv[i], "-e"))
      max_bytes = parse_bytes(argv[i + 1]);
    else if (!strcmp(argv[i], "-f"))
      factor = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "-n"))
      iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w"))
      warmup = atoi(argv[i + 1]);
  }
  const size_t max_count = (size_t)(max_bytes / 4) + 1;
  float* send = calloc(max_count, 4);
  float* recv = calloc(max_count, 4);
  if (rank == 0)
    printf("impl,collective,ranks,size,count,type,redop,placement,time_us,algbw,busbw,wrong\n");
  for (double bytes = min_bytes; bytes <= max_bytes * 1.0000001; bytes *= factor) {
    const int count = (int)(bytes / 4);
    if (count == 0) continue;
    for (int in_place = 0; in_place < 2; ++in_place) {
      for (int k = 0; k < warmup; ++k) {
        MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, count, MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      for (int k = 0; k < iters; ++k) {
        MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, count, MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      }
      double elapsed = MPI_Wtime() - start, slowest = 0;
      MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rank == 0) {
        const double us = slowest / iters * 1e6;
        const double algbw = count * 4.0 / us / 1e3;
        printf("mpi,all_reduce,%d,%d,%d,float,sum,%s,%.3f,%.3f,%.3f,-1\n", size, count * 4, count,
               in_place ? "in" : "out", us, algbw, algbw * 2.0 * (size - 1) / size);
        fflush(stdout);
      }
    }
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
