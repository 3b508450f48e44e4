/* What a barrier leaves behind: how far apart it releases the ranks, and what the next
 * call MPI serves then costs (issue 45 item 3). Each iteration: MPI_Barrier, every rank
 * reads the wall clock on its way out (the lab's ranks share one machine's clock), then
 * times an exchange MPI always serves itself (MPI_Sendrecv of 8 bytes around a ring:
 * innet never serves point-to-point). The release times and exchange times go to rank 0
 * every iteration (outside the timed part).
 *
 *   barrier_skew [-i iterations] [-w warm-up]
 *
 * Output (rank 0): "barrier_skew iterations=<n> skew_us=<mean of max-min release>
 * skew_p50_us=<median> next_us=<mean of the slowest rank's exchange> barrier_us=<mean
 * of the slowest rank's barrier>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double wall_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, opt, iterations = 1000, warmup = 100;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    while ((opt = getopt(argc, argv, "i:w:")) != -1) {
        if (opt == 'i') iterations = atoi(optarg);
        else if (opt == 'w') warmup = atoi(optarg);
        else {
            if (rank == 0) fprintf(stderr, "usage: barrier_skew [-i iterations] [-w warm-up]\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    double *skews = calloc((size_t)iterations, sizeof *skews);
    double *all = calloc((size_t)size * 3, sizeof *all);
    double next_sum = 0, barrier_sum = 0, skew_sum = 0;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int i = -warmup; i < iterations; i++) {
        double before = wall_us();
        MPI_Barrier(MPI_COMM_WORLD);
        double released = wall_us();
        long out = rank, in = -1;
        MPI_Sendrecv(&out, 1, MPI_LONG, right, 7, &in, 1, MPI_LONG, left, 7, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        double next = wall_us() - released;
        if (in != left) {
            fprintf(stderr, "rank %d: got %ld from %d\n", rank, in, left);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        double mine[3] = {released, next, released - before};
        MPI_Gather(mine, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (rank == 0 && i >= 0) {
            double lo = all[0], hi = all[0], slowest = 0, longest = 0;
            for (int r = 0; r < size; r++) {
                double t = all[3 * r];
                lo = t < lo ? t : lo;
                hi = t > hi ? t : hi;
                slowest = all[3 * r + 1] > slowest ? all[3 * r + 1] : slowest;
                longest = all[3 * r + 2] > longest ? all[3 * r + 2] : longest;
            }
            skews[i] = hi - lo;
            skew_sum += hi - lo;
            next_sum += slowest;
            barrier_sum += longest;
        }
    }
    if (rank == 0) {
        qsort(skews, (size_t)iterations, sizeof *skews, by_value);
        printf("barrier_skew iterations=%d skew_us=%.2f skew_p50_us=%.2f next_us=%.2f "
               "barrier_us=%.2f\n",
               iterations, skew_sum / iterations, skews[iterations / 2], next_sum / iterations,
               barrier_sum / iterations);
    }
    free(skews);
    free(all);
    MPI_Finalize();
    return 0;
}
