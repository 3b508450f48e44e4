/* A long-running job's pulse: MPI_Allreduce of 16 int32 (SUM) back to back for a while,
 * every result checked, like the collectives between a simulation's timesteps. Rank 0
 * counts the calls finished in each 100 ms window and prints them at the end, so a run
 * shows how long any disturbance slowed the job down.
 *
 *   steady_allreduce [-t seconds] [-p at:seconds]
 *   -t: how long to run (default 10)
 *   -p: at `at` seconds, every rank computes (sleeps) for `seconds` without communicating
 *
 * Output (rank 0): "start_epoch_ms <ms>" (the wall clock when the windows start, so an
 * observer can line them up with its own events), "window <start_ms> <calls>" lines, then
 * "calls <n> wrong <n>". Every rank stops at the same call: rank 0's decision travels in the
 * allreduce itself. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUNT 16
#define WINDOW_S 0.1
#define FLAG_STOP 1
#define FLAG_PAUSE 2

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, opt;
    double seconds = 10, pause_at = -1, pause_for = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    while ((opt = getopt(argc, argv, "t:p:")) != -1) {
        if (opt == 't') seconds = atof(optarg);
        else if (opt == 'p' && sscanf(optarg, "%lf:%lf", &pause_at, &pause_for) == 2) {}
        else {
            if (rank == 0) fprintf(stderr, "usage: steady_allreduce [-t seconds] [-p at:seconds]\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    int windows = (int)(seconds / WINDOW_S) + 2;
    long *per_window = calloc((size_t)windows, sizeof *per_window);
    long calls = 0, wrong = 0;
    int in[COUNT + 1], out[COUNT + 1];
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    long long start_epoch_ms = (long long)wall.tv_sec * 1000 + wall.tv_nsec / 1000000;
    int paused = 0;
    for (;;) {
        double now = MPI_Wtime() - start;
        for (int i = 0; i < COUNT; i++) in[i] = rank + i + (int)(calls % 1000);
        /* The last element carries rank 0's decision (the others add 0). */
        in[COUNT] = 0;
        if (rank == 0) {
            if (now >= seconds) in[COUNT] = FLAG_STOP;
            else if (!paused && pause_at >= 0 && now >= pause_at) in[COUNT] = FLAG_PAUSE;
        }
        MPI_Allreduce(in, out, COUNT + 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        calls++;
        for (int i = 0; i < COUNT; i++) {
            long want = (long)size * (size - 1) / 2 + (long)size * (i + (int)((calls - 1) % 1000));
            if (out[i] != want) wrong++;
        }
        int w = (int)((MPI_Wtime() - start) / WINDOW_S);
        if (w >= 0 && w < windows) per_window[w]++;
        if (out[COUNT] == FLAG_STOP) break;
        if (out[COUNT] == FLAG_PAUSE) {
            paused = 1;
            usleep((useconds_t)(pause_for * 1e6));
        }
    }
    long all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("start_epoch_ms %lld\n", start_epoch_ms);
        for (int w = 0; w < windows; w++) printf("window %d %ld\n", (int)(w * WINDOW_S * 1000), per_window[w]);
        printf("calls %ld wrong %ld\n", calls, all_wrong);
    }
    free(per_window);
    MPI_Finalize();
    return all_wrong != 0 && rank == 0;
}
