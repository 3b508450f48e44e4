"""A Krylov solver as applications run one: PETSc's conjugate gradient (Jacobi
preconditioner) on the 5-point Laplacian of an N x N grid, rows split across the ranks,
through petsc4py. Each iteration is a sparse product (halo exchange: point-to-point MPI)
and three small allreduces (two dot products, a norm).

Usage: mpirun ... python3 cg.py N ITERATIONS
A first solve warms up (not timed); the second runs exactly ITERATIONS iterations
(tolerances off) and is timed. Rank 0 prints one line the benchmark reads:
  cg grid=N ranks=P iterations=K seconds=T per_iteration_us=U residual=R rhs_norm=B
(R: the final residual norm; B: the right-hand side's, the first residual's).
"""

import sys
import time

from petsc4py import PETSc


def laplacian(n):
    a = PETSc.Mat().createAIJ([n * n, n * n], nnz=5, comm=PETSc.COMM_WORLD)
    start, end = a.getOwnershipRange()
    for row in range(start, end):
        i, j = divmod(row, n)
        a.setValue(row, row, 4.0)
        if i > 0:
            a.setValue(row, row - n, -1.0)
        if i < n - 1:
            a.setValue(row, row + n, -1.0)
        if j > 0:
            a.setValue(row, row - 1, -1.0)
        if j < n - 1:
            a.setValue(row, row + 1, -1.0)
    a.assemble()
    return a


def solver(a, iterations):
    ksp = PETSc.KSP().create(comm=PETSc.COMM_WORLD)
    ksp.setOperators(a)
    ksp.setType("cg")
    ksp.getPC().setType("jacobi")
    # No tolerance ends it early: every run does the same work.
    ksp.setTolerances(rtol=0.0, atol=0.0, divtol=1e300, max_it=iterations)
    ksp.setNormType(PETSc.KSP.NormType.UNPRECONDITIONED)
    ksp.setErrorIfNotConverged(False)
    return ksp


def main():
    n, iterations = int(sys.argv[1]), int(sys.argv[2])
    a = laplacian(n)
    b = a.createVecLeft()
    b.set(1.0)
    x = a.createVecRight()
    ksp = solver(a, iterations)
    ksp.solve(b, x)
    x.set(0.0)
    PETSc.COMM_WORLD.barrier()
    start = time.perf_counter()
    ksp.solve(b, x)
    seconds = time.perf_counter() - start
    done = ksp.getIterationNumber()
    residual = ksp.getResidualNorm()
    if PETSc.COMM_WORLD.getRank() == 0:
        print(
            f"cg grid={n} ranks={PETSc.COMM_WORLD.getSize()} iterations={done} "
            f"seconds={seconds:.6f} per_iteration_us={seconds / max(done, 1) * 1e6:.3f} "
            f"residual={residual:.17e} rhs_norm={b.norm():.17e}",
            flush=True,
        )


main()
