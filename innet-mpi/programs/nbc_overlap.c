/* How much of a non-blocking collective hides behind computation (issue 45 item 2), by
 * OSU's method, with the computation either spinning the CPU (OSU's own) or sleeping, as a
 * rank does that waits for a GPU kernel or for I/O.
 *
 * Per size: the pure time of start + MPI_Wait; then start, compute for that long, MPI_Wait.
 * overlap = 100 × (1 − (overall − compute) / pure), at least 0: 100 % when the wait after
 * the computation costs nothing. Times are each rank's means, averaged over the ranks (as
 * OSU reports them). Every result is checked.
 *
 *   nbc_overlap [-k iallreduce|ibcast|ireduce|ibarrier] [-c spin|sleep|spin,sleep]
 *               [-m MIN:MAX] [-i iterations] [-x warm-up]
 *
 * Output (rank 0), a line per size and computation: "nbc_overlap kind=<k> compute=<c> bytes=<n>
 * pure_us=<> overall_us=<> compute_us=<> start_us=<the start call> wait_us=<the wait after
 * the computation> overlap_pct=<> wrong=<calls with a wrong result over every rank>". */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

enum kind { IALLREDUCE, IBCAST, IREDUCE, IBARRIER };
static const char *const KINDS[] = {"iallreduce", "ibcast", "ireduce", "ibarrier"};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Computes for `seconds`: spins on the clock (OSU's compute keeps the CPU the same way),
 * or sleeps until then (the CPU is free for the rest of the node). */
static void compute(double seconds, int sleeping) {
    double until = now_s() + seconds;
    if (!sleeping) {
        while (now_s() < until) {
        }
        return;
    }
    struct timespec t = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) != 0) {
    }
}

struct call {
    enum kind kind;
    int rank, size, count; /* ints */
    int *send, *recv;
};

static void start(struct call *c, int iteration, MPI_Request *req) {
    for (int j = 0; j < c->count; j++) c->send[j] = c->rank + iteration + j;
    switch (c->kind) {
    case IALLREDUCE:
        MPI_Iallreduce(c->send, c->recv, c->count, MPI_INT, MPI_SUM, MPI_COMM_WORLD, req);
        break;
    case IREDUCE:
        MPI_Ireduce(c->send, c->recv, c->count, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD, req);
        break;
    case IBCAST:
        if (c->rank == 0) memcpy(c->recv, c->send, (size_t)c->count * sizeof(int));
        else memset(c->recv, 0xff, (size_t)c->count * sizeof(int));
        MPI_Ibcast(c->recv, c->count, MPI_INT, 0, MPI_COMM_WORLD, req);
        break;
    case IBARRIER:
        MPI_Ibarrier(MPI_COMM_WORLD, req);
        break;
    }
}

/* Whether the call of `iteration` left the right result. */
static int right(const struct call *c, int iteration) {
    long long n = c->size;
    for (int j = 0; j < c->count; j++) {
        long long want;
        switch (c->kind) {
        case IALLREDUCE:
            want = n * (n - 1) / 2 + n * (iteration + j);
            break;
        case IREDUCE:
            if (c->rank != 0) return 1;
            want = n * (n - 1) / 2 + n * (iteration + j);
            break;
        case IBCAST:
            want = iteration + j; /* the root's values */
            break;
        default:
            return 1;
        }
        if ((long long)c->recv[j] != want) return 0;
    }
    return 1;
}

/* Mean seconds per call over `iterations` (after `warmup`): start, compute for `seconds`
 * (none when negative), wait. `parts` gets the mean start, computation and wait, and the
 * whole iteration with its barrier (what the program's loop takes: a barrier that makes the
 * call after it slower shows there). */
static double timed(struct call *c, int warmup, int iterations, double seconds, int sleeping,
                    double parts[4], int *wrong) {
    double total = 0, init = 0, comp = 0, wait = 0, loop0 = 0;
    for (int i = -warmup; i < iterations; i++) {
        MPI_Request req;
        if (i == 0) loop0 = now_s();
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        start(c, i, &req);
        double c0 = now_s();
        if (seconds > 0) compute(seconds, sleeping);
        double c1 = now_s();
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        double t1 = now_s();
        if (!right(c, i)) (*wrong)++;
        if (i >= 0) {
            total += t1 - t0;
            init += c0 - t0;
            comp += c1 - c0;
            wait += t1 - c1;
        }
    }
    parts[0] = init / iterations;
    parts[1] = comp / iterations;
    parts[2] = wait / iterations;
    parts[3] = (now_s() - loop0) / iterations;
    return total / iterations;
}

static void usage(int rank) {
    if (rank == 0)
        fprintf(stderr, "usage: nbc_overlap [-k iallreduce|ibcast|ireduce|ibarrier] "
                        "[-c spin|sleep|spin,sleep] [-m MIN:MAX] [-i iterations] "
                        "[-x warm-up]\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, opt, iterations = 1000, warmup = 100, spin = 1, sleep = 0;
    long min = 4, max = 256;
    enum kind kind = IALLREDUCE;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    while ((opt = getopt(argc, argv, "k:c:m:i:x:")) != -1) {
        if (opt == 'k') {
            int k = 0;
            while (k < 4 && strcmp(optarg, KINDS[k]) != 0) k++;
            if (k == 4) usage(rank);
            kind = (enum kind)k;
        } else if (opt == 'c') {
            spin = strcmp(optarg, "spin") == 0 || strcmp(optarg, "spin,sleep") == 0;
            sleep = strcmp(optarg, "sleep") == 0 || strcmp(optarg, "spin,sleep") == 0;
            if (!spin && !sleep) usage(rank);
        } else if (opt == 'm') {
            if (sscanf(optarg, "%ld:%ld", &min, &max) != 2 || min < 4 || max < min) usage(rank);
        } else if (opt == 'i') iterations = atoi(optarg);
        else if (opt == 'x') warmup = atoi(optarg);
        else usage(rank);
    }
    if (iterations < 1 || warmup < 0) usage(rank);
    /* Sleeps end when asked, not up to 50 µs later (the default timer slack). */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct call c = {kind, rank, size, 0, malloc((size_t)max), malloc((size_t)max)};
    if (kind == IBARRIER) min = max = 4;
    for (long bytes = min; bytes <= max; bytes *= 2) {
        c.count = (int)(bytes / (long)sizeof(int));
        for (int sleeping = !spin; sleeping <= sleep; sleeping++) {
            int wrong = 0;
            double unused[4], parts[4];
            double pure = timed(&c, warmup, iterations, -1, sleeping, unused, &wrong);
            /* Each rank computes as long as its own pure call took (OSU's rule). */
            double overall = timed(&c, warmup, iterations, pure, sleeping, parts, &wrong);
            double mine[6] = {pure, overall, parts[1], parts[0], parts[2], parts[3]}, sum[6];
            int wrong_all = 0;
            MPI_Reduce(mine, sum, 6, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
            MPI_Reduce(&wrong, &wrong_all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                double p = sum[0] / size * 1e6, o = sum[1] / size * 1e6, k = sum[2] / size * 1e6;
                double overlap = 100.0 * (1.0 - (o - k) / p);
                printf("nbc_overlap kind=%s compute=%s bytes=%ld pure_us=%.2f overall_us=%.2f "
                       "compute_us=%.2f start_us=%.2f wait_us=%.2f iteration_us=%.2f "
                       "overlap_pct=%.1f wrong=%d\n",
                       KINDS[kind], sleeping ? "sleep" : "spin", bytes, p, o, k,
                       sum[3] / size * 1e6, sum[4] / size * 1e6, sum[5] / size * 1e6,
                       overlap < 0 ? 0.0 : overlap, wrong_all);
                fflush(stdout);
            }
        }
    }
    free(c.send);
    free(c.recv);
    MPI_Finalize();
    return 0;
}
