/* An osu_allreduce-style latency test, measured the way OSU 5.x's osu_allreduce measures
 * (OSU's own source is in no package registry this project's CI can reach, so this is a
 * re-implementation of its method, not its code): for each size a barrier, then warm-up
 * and timed iterations, each iteration timing one MPI_Allreduce alone and followed by an
 * MPI_Barrier; each rank's average over its timed calls, reported as the average, min and
 * max over the ranks (OSU's columns). int32 SUM by default (innet's benchmark type). One
 * result per size is checked.
 *
 *   osu_allreduce [-i iterations] [-w warmup] [-f] [size ...]
 *   -f: float64 SUM (sizes are bytes; they must hold whole elements) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, iters = 1000, warmup = 100, f64 = 0, opt;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    while ((opt = getopt(argc, argv, "i:w:f")) != -1) {
        if (opt == 'i') iters = atoi(optarg);
        else if (opt == 'w') warmup = atoi(optarg);
        else if (opt == 'f') f64 = 1;
        else {
            if (rank == 0) fprintf(stderr, "usage: osu_allreduce [-i N] [-w N] [-f] [bytes ...]\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    int defaults[] = {4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 65536};
    int nsizes = argc > optind ? argc - optind : (int)(sizeof defaults / sizeof *defaults);
    MPI_Datatype t = f64 ? MPI_DOUBLE : MPI_INT;
    int width = f64 ? 8 : 4;
    if (rank == 0) printf("# osu_allreduce %s SUM, %d ranks\n# bytes avg_us min_us max_us iterations\n",
                          f64 ? "float64" : "int32", size);
    for (int s = 0; s < nsizes; s++) {
        int bytes = argc > optind ? atoi(argv[optind + s]) : defaults[s];
        int count = bytes / width;
        if (count < 1 || count * width != bytes) {
            if (rank == 0) fprintf(stderr, "osu_allreduce: %d bytes is not a whole number of %d-byte elements\n", bytes, width);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* Long messages: fewer iterations, as OSU does above 8 KiB. */
        int n = bytes > 8192 ? (iters / 10 > 10 ? iters / 10 : 10) : iters;
        int w = bytes > 8192 ? (warmup / 10 > 2 ? warmup / 10 : 2) : warmup;
        char *in = malloc((size_t)bytes), *out = malloc((size_t)bytes);
        for (int i = 0; i < count; i++) {
            if (f64) ((double *)in)[i] = rank + i % 7;
            else ((int *)in)[i] = rank + i % 7;
        }
        double timer = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < w + n; i++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(in, out, count, t, MPI_SUM, MPI_COMM_WORLD);
            if (i >= w) timer += MPI_Wtime() - t0;
            MPI_Barrier(MPI_COMM_WORLD);
        }
        double mine = timer * 1e6 / n, sum, lo, hi;
        for (int i = 0; i < count; i++) {
            double want = (double)size * (size - 1) / 2 + (double)size * (i % 7);
            double got = f64 ? ((double *)out)[i] : ((int *)out)[i];
            if (got != want) {
                fprintf(stderr, "osu_allreduce: rank %d: %d bytes: element %d is %g, not %g\n",
                        rank, bytes, i, got, want);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        }
        MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%d %.2f %.2f %.2f %d\n", bytes, sum / size, lo, hi, n);
        fflush(stdout);
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
