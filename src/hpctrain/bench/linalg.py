"""Ax = b to fp64 accuracy from an LU factorisation in lower precision: mixed-precision
iterative refinement, the courses' example of Tensor Cores serving HPC (Haidar, Tomov,
Dongarra and Higham, SC18; Carson and Higham, SIAM J. Sci. Comput. 2018).

The O(n^3) work, the LU factorisation, runs in the factor precision: a blocked right-looking
LU with partial pivoting whose trailing updates (nearly all its flops) multiply inputs rounded
to fp16, bf16 or tf32 and accumulate in fp32, as Tensor Cores do; its panels are factored in
fp32. The O(n^2) work, residuals and corrections, runs in fp64. Plain refinement converges
while the condition number times the factor precision's unit roundoff stays well below 1;
beyond, GMRES preconditioned by the same LU (GMRES-IR) still reaches fp64 accuracy for far
larger condition numbers. Beyond what either can refine, a clear error says so and which
precision would do.

torch.linalg has no LU in fp16 or bf16 (and none that rounds to tf32 on the CPU): the blocked
LU here is ours, its panels and triangular solves torch's.

The tolerance: a solution is accepted when its normwise backward error ||b - Ax|| / (||A||
||x|| + ||b||) (infinity norms, computed in fp64) is at most max(n, 16) x 2^-53. LU with
partial pivoting in fp64, torch.linalg.solve's, is backward stable with an error bound of
order n x u (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., thm 9.4; in
practice far below the bound): so the refined x is as good an answer as fp64's own solver
gives, and no better can be asked of data stored in fp64. The floor of 16 keeps tiny systems
from asking for less than a few units of roundoff.

What is refused, each with why: NaN or Inf in A or b; entries beyond the factor precision's
range (fp16 tops out at 65504), or a factorisation whose growth overflows it; a matrix
singular in fp64, also when b lies in its range (a rank-deficient A then has infinitely many
solutions: after the solve, a second solve for a random right-hand side shows whether A has a
bounded inverse, and a suspicious one is settled by A's singular values in fp64); a system
too ill-conditioned for the factor precision, with its condition number and the precision
that would do. b = 0 is solved by x = 0, whatever A is (the least-norm solution), without
factoring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from hpctrain.errors import UserError

FACTOR_PRECISIONS = ("fp16", "bf16", "tf32", "fp32")
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "tf32": 2.0 ** -11, "fp32": 2.0 ** -24}
LARGEST = {"fp16": 65504.0}  # finite range below fp32's, where inputs can overflow
FP64_EPS = 2.0 ** -53
BLOCK = 64
PROBE_SEED = 1234  # the random right-hand side that tests A for a bounded inverse


class NotRefinable(UserError):
    """The system is singular, or too ill-conditioned for the factor precision."""


@dataclass
class Solution:
    x: torch.Tensor  # fp64
    backward_error: float  # ||b - Ax|| / (||A|| ||x|| + ||b||), infinity norms
    iterations: int  # refinement steps (GMRES-IR: its outer steps)
    method: str  # "refinement" or "gmres-ir"
    history: list[float] = field(default_factory=list)  # the backward error after each step


def conditioned_matrix(n: int, condition: float, seed: int = 0,
                       device: str | torch.device = "cpu") -> torch.Tensor:
    """A random n x n fp64 matrix with singular values spread geometrically from 1 down to
    1/condition (random orthogonal factors): the test systems of the refinement literature."""
    generator = torch.Generator().manual_seed(seed)
    q1, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    q2, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    values = torch.logspace(0, -math.log10(condition), n, dtype=torch.float64)
    return (q1 @ torch.diag(values) @ q2.T).to(device)


def round_to(tensor: torch.Tensor, precision: str) -> torch.Tensor:
    """fp32 values rounded to `precision` (to nearest), kept in fp32."""
    if precision in ("fp16", "bf16"):
        low = torch.float16 if precision == "fp16" else torch.bfloat16
        return tensor.to(low).to(torch.float32)
    if precision == "tf32":  # 10 mantissa bits: round the low 13 of fp32's 23 away
        bits = tensor.contiguous().view(torch.int32)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return tensor


def lu_factor(A: torch.Tensor, precision: str, block: int = BLOCK):
    """(LU, pivots) as torch.linalg.lu_factor returns them, from A rounded to `precision`,
    the trailing updates' products taken from inputs rounded to `precision` (fp32 sums)."""
    work = round_to(A.to(torch.float32).clone(), precision)
    n = work.shape[0]
    order = torch.arange(n, device=work.device)
    for k in range(0, n, block):
        end = min(k + block, n)
        panel, pivots, info = torch.linalg.lu_factor_ex(work[k:, k:end])
        if not torch.isfinite(panel).all():
            raise NotRefinable(f"the LU factorisation overflowed {precision}'s range at column "
                               f"{k} (its entries grew beyond {LARGEST.get(precision, 3.4e38):g}"
                               f"): {_range_hint(precision)}")
        if info.item() != 0:
            raise NotRefinable(f"A is singular to the factor precision {precision} (a zero "
                               f"pivot in column {k + int(info.item()) - 1}): no solution "
                               "to refine; check A, or give a nonsingular one")
        swap = torch.arange(n - k, device=work.device)  # the panel's row swaps, as a perm.
        for i, p in enumerate((pivots - 1).tolist()):
            swap[[i, p]] = swap[[p, i]]
        work[k:] = work[k:][swap]
        order[k:] = order[k:][swap]
        work[k:, k:end] = panel
        if end < n:
            lower = torch.tril(panel[:end - k], -1) + torch.eye(end - k, device=work.device)
            work[k:end, end:] = torch.linalg.solve_triangular(lower, work[k:end, end:],
                                                              upper=False, unitriangular=True)
            work[end:, end:] -= round_to(work[end:, k:end], precision) @ \
                round_to(work[k:end, end:], precision)
    return work, order


def _solve_factored(factors, b: torch.Tensor) -> torch.Tensor:
    """x with LU x = P b, in fp32, for an fp64 b; returned in fp64."""
    work, order = factors
    rhs = b.to(torch.float32)[order]
    y = torch.linalg.solve_triangular(work, rhs.unsqueeze(-1), upper=False,
                                      unitriangular=True)
    x = torch.linalg.solve_triangular(work, y, upper=True)
    return x.squeeze(-1).to(torch.float64)


def backward_error(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> float:
    """Normwise backward error in the infinity norm, computed in fp64."""
    r = b - A @ x
    denominator = torch.linalg.matrix_norm(A, ord=math.inf) * x.abs().max() + b.abs().max()
    return (r.abs().max() / denominator).item()


def solve(A: torch.Tensor, b: torch.Tensor, factor_precision: str = "fp32",
          max_iterations: int = 30, tolerance: float | None = None) -> Solution:
    """x with Ax = b, to fp64 backward error (the tolerance: see the module's docstring),
    factoring A in `factor_precision`."""
    if factor_precision not in FACTOR_PRECISIONS:
        raise UserError(f"factor_precision={factor_precision!r}: use one of "
                        f"{', '.join(FACTOR_PRECISIONS)}")
    if A.ndim != 2 or A.shape[0] != A.shape[1] or b.shape != (A.shape[0],):
        raise UserError(f"solve: A must be square (n, n) and b (n,); got {tuple(A.shape)} and "
                        f"{tuple(b.shape)}")
    A64, b64 = A.to(torch.float64), b.to(torch.float64)
    _refuse_non_finite(A64, "A")
    _refuse_non_finite(b64, "b")
    if not b64.any():  # x = 0 solves it (the least-norm solution if A is singular)
        return Solution(torch.zeros_like(b64), 0.0, 0, "b = 0", [0.0])
    _refuse_out_of_range(A64, factor_precision)
    n = A.shape[0]
    tolerance = tolerance if tolerance is not None else max(n, 16) * FP64_EPS
    factors = lu_factor(A64, factor_precision)
    solution = _checked(A64, b64, _refine(A64, b64, factors, factor_precision, tolerance,
                                          max_iterations))
    _refuse_rank_deficient(A64, factors, factor_precision, tolerance, max_iterations)
    return solution


def _refuse_non_finite(tensor: torch.Tensor, name: str) -> None:
    bad = ~torch.isfinite(tensor)
    if bad.any():
        where = [int(i) for i in bad.nonzero()[0]]
        value = tensor[tuple(where)].item()
        what = "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"
        at = f"row {where[0]}, column {where[1]}" if len(where) == 2 else f"entry {where[0]}"
        count = int(bad.sum())
        raise NotRefinable(f"{name} holds {what} at {at} ({count} entr"
                           f"{'y' if count == 1 else 'ies'} NaN or Inf in all): a linear "
                           "system needs finite numbers; check how it was computed")


def _refuse_out_of_range(A: torch.Tensor, precision: str) -> None:
    largest = LARGEST.get(precision)
    top = A.abs().max().item()
    if largest is not None and top > largest:
        raise NotRefinable(f"A's largest entry, {top:.3g}, overflows {precision} (its "
                           f"largest number is {largest:g}): {_range_hint(precision)}")


def _range_hint(precision: str) -> str:
    if precision == "fp16":
        return ("factor in bf16, which has fp32's range, or scale A (and b) by a power of 2 "
                "(exact in every precision) so that its entries stay below 2^15")
    return "scale A (and b) by a power of 2 (exact in every precision)"


def _refine(A, b, factors, precision: str, tolerance: float, max_iterations: int) -> Solution:
    """Plain refinement from the factors; GMRES-IR where it stalls; NotRefinable where that
    fails too."""
    x = _solve_factored(factors, b)
    history = [backward_error(A, x, b)]
    for step in range(1, max_iterations + 1):
        if history[-1] <= tolerance:
            return Solution(x, history[-1], step - 1, "refinement", history)
        x = x + _solve_factored(factors, b - A @ x)
        history.append(backward_error(A, x, b))
        if not math.isfinite(history[-1]) or (step >= 2 and history[-1] > 0.5 * history[-3]):
            break  # no longer halving in two steps: plain refinement has stalled
    if history[-1] <= tolerance:
        return Solution(x, history[-1], len(history) - 1, "refinement", history)
    return _gmres_ir(A, b, factors, precision, tolerance, max_iterations)


def _refuse_rank_deficient(A, factors, precision: str, tolerance: float,
                           max_iterations: int) -> None:
    """A consistent system with a rank-deficient A (b in its range) refines to a small
    backward error like any other: its x is one of infinitely many. A solve for a random
    right-hand side shows whether A^-1 is bounded (||A|| ||y|| / ||r|| bounds kappa from
    below); where it does not converge or hints at fp64 singularity, A's singular values in
    fp64 decide (O(n^3), but only then)."""
    r = torch.randn(A.shape[0], dtype=torch.float64,
                    generator=torch.Generator().manual_seed(PROBE_SEED)).to(A.device)
    try:
        y = _refine(A, r, factors, precision, tolerance, max_iterations).x
        suspicious = _kappa_bound(A, y, r) * A.shape[0] * FP64_EPS >= 1
    except NotRefinable:
        suspicious = True
    if not suspicious:
        return
    values = torch.linalg.svdvals(A)
    rank = int((values > A.shape[0] * FP64_EPS * values[0]).sum())
    if rank < A.shape[0]:
        raise NotRefinable(f"A is rank-deficient: rank {rank} of {A.shape[0]} in fp64 (its "
                           f"smallest singular values are below n x eps x its largest), so "
                           "Ax = b has no unique solution, even with b in A's range; remove "
                           "the dependent rows and columns, or solve a least-squares problem "
                           "(torch.linalg.lstsq)")


def _kappa_bound(A, x, b) -> float:
    """||A|| ||x|| / ||b||: kappa(A) is at least this, for any x with Ax = b."""
    return (torch.linalg.matrix_norm(A, ord=math.inf) * x.abs().max() / b.abs().max()).item()


def _checked(A, b, solution: Solution) -> Solution:
    """The solution, unless it shows A to be singular in fp64: kappa(A) >= ||A|| ||x|| / ||b||,
    and from 1/(n eps) on a small backward error only says that x solves a nearby singular
    system: its forward error may be as large as x."""
    bound = _kappa_bound(A, solution.x, b)
    if not math.isfinite(bound) or bound * A.shape[0] * FP64_EPS >= 1:
        raise NotRefinable(f"A is singular to fp64 precision (its condition number is at "
                           f"least {bound:.1e}): Ax = b has no meaningful solution; check A")
    return solution


def _gmres_ir(A, b, factors, precision: str, tolerance: float, max_iterations: int):
    """Refinement whose correction equations are solved by GMRES in fp64, left-preconditioned
    by the low-precision LU: it converges where plain refinement stalls."""
    x = _solve_factored(factors, b)
    if not torch.isfinite(x).all():
        x = torch.zeros_like(b)
    history = [backward_error(A, x, b)]
    for step in range(1, max_iterations + 1):
        if history[-1] <= tolerance:
            return Solution(x, history[-1], step - 1, "gmres-ir", history)
        x = x + _gmres(A, b - A @ x, factors, min(A.shape[0], 500))
        history.append(backward_error(A, x, b))
        if not math.isfinite(history[-1]) or (step >= 3 and history[-1] > 0.9 * history[-3]):
            break
    if history[-1] <= tolerance:
        return Solution(x, history[-1], len(history) - 1, "gmres-ir", history)
    raise NotRefinable(f"the system is too ill-conditioned for factors in {precision}: the "
                       f"backward error stayed at {history[-1]:.1e} (needed {tolerance:.1e}) "
                       f"after plain refinement and GMRES-IR; {_advice(A, precision)}")


def _advice(A, precision: str) -> str:
    """The precision to factor in instead: the lowest whose unit roundoff u keeps kappa x u
    below 1, where refinement is assured to converge (Carson and Higham 2018); kappa taken
    in fp64 (O(n^3), on this failing path only)."""
    kappa = torch.linalg.cond(A, p=math.inf).item()
    for candidate in FACTOR_PRECISIONS[FACTOR_PRECISIONS.index(precision) + 1:]:
        if kappa * UNIT_ROUNDOFF[candidate] < 1:
            return (f"its condition number is {kappa:.1e}: factor in {candidate} "
                    f"(kappa x u = {kappa * UNIT_ROUNDOFF[candidate]:.1e})")
    return (f"its condition number is {kappa:.1e}, beyond what refinement from fp32 factors "
            f"is assured to reach (kappa x u = {kappa * UNIT_ROUNDOFF['fp32']:.1e}): solve in "
            "fp64 (torch.linalg.solve)")


def _gmres(A, r, factors, iterations: int, reduction: float = 1e-10) -> torch.Tensor:
    """d with M^-1 A d ~ M^-1 r (M = the LU), by GMRES from 0 in fp64: until the
    preconditioned residual has shrunk by `reduction` (checked every 10 steps) or after
    `iterations` steps."""
    z = _solve_factored(factors, r)
    beta = torch.linalg.vector_norm(z)
    if beta == 0 or not torch.isfinite(beta):
        return torch.zeros_like(r)
    basis = [z / beta]
    hessenberg = torch.zeros(iterations + 1, iterations, dtype=torch.float64, device=r.device)
    target = torch.zeros(iterations + 1, dtype=torch.float64, device=r.device)
    target[0] = beta
    for j in range(iterations):
        w = _solve_factored(factors, A @ basis[j])
        for i in range(j + 1):  # modified Gram-Schmidt
            hessenberg[i, j] = torch.dot(w, basis[i])
            w = w - hessenberg[i, j] * basis[i]
        hessenberg[j + 1, j] = torch.linalg.vector_norm(w)
        done = hessenberg[j + 1, j] <= 1e-14 * beta
        if not done:
            basis.append(w / hessenberg[j + 1, j])
        if done or (j + 1) % 10 == 0 or j + 1 == iterations:
            y = torch.linalg.lstsq(hessenberg[:j + 2, :j + 1],
                                   target[:j + 2].unsqueeze(-1)).solution.squeeze(-1)
            left = torch.linalg.vector_norm(hessenberg[:j + 2, :j + 1] @ y - target[:j + 2])
            if done or left <= reduction * beta or j + 1 == iterations:
                return torch.stack(basis[:j + 1], dim=1) @ y
    raise AssertionError("unreachable: the last step returns")
