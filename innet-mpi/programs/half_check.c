/* Checks MPI_Allreduce of MPIX_C_FLOAT16 (MPICH's IEEE binary16) with SUM, PROD, MIN and MAX,
 * in place and not, at 1, 700 and 3000 elements, against the local reduction of every rank's
 * (deterministic) input: small integers and powers of two, exact in any order. Run only
 * with the interposer: Debian's MPICH 4.0.2 aborts on such an allreduce of its own. An MPI
 * without MPIX_C_FLOAT16 has nothing to check. Exits non-zero on the first wrong result. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
#ifdef MPIX_C_FLOAT16
    MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
    const char *names[] = {"sum", "prod", "min", "max"};
    int counts[] = {1, 700, 3000}, checks = 0;
    for (int o = 0; o < 4; o++) {
        for (int c = 0; c < 3; c++) {
            int n = counts[c], in_place = (o + c) % 2;
            _Float16 *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
            /* Rank r's element i: −11 … 11, or for PROD one of ±1/2, ±1, ±2. */
#define VALUE(r, i)                                                                            \
    (o == 1 ? (_Float16)((float[]){1, -1, 2, 0.5f, -2, 1, -0.5f}[((r) * 3 + (i)) % 7])          \
            : (_Float16)(((r) * 7 + (i) * 13) % 23 - 11))
            for (int i = 0; i < n; i++) in[i] = VALUE(rank, i);
            if (in_place) {
                memcpy(out, in, n * sizeof *in);
                MPI_Allreduce(MPI_IN_PLACE, out, n, MPIX_C_FLOAT16, ops[o], MPI_COMM_WORLD);
            } else {
                MPI_Allreduce(in, out, n, MPIX_C_FLOAT16, ops[o], MPI_COMM_WORLD);
            }
            for (int i = 0; i < n; i++) {
                _Float16 acc = VALUE(0, i);
                for (int r = 1; r < size; r++) {
                    _Float16 v = VALUE(r, i);
                    acc = o == 0 ? acc + v : o == 1 ? acc * v : o == 2 ? (v < acc ? v : acc)
                                                                     : (v > acc ? v : acc);
                }
                if (memcmp(&acc, &out[i], sizeof acc)) {
                    fprintf(stderr, "half_check: rank %d: %s ×%d element %d: %g, want %g\n", rank,
                            names[o], n, i, (double)out[i], (double)acc);
                    MPI_Abort(MPI_COMM_WORLD, 2);
                }
            }
            checks++;
            free(in);
            free(out);
        }
    }
    int total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("half_check: %d float16 checks passed on %d ranks\n", total, size);
#else
    if (rank == 0) printf("half_check: this MPI has no MPIX_C_FLOAT16\n");
#endif
    MPI_Finalize();
    return 0;
}
