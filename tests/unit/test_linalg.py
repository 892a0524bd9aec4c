"""hpctrain.bench.linalg.solve: fp64 accuracy from low-precision LU factors, by plain iterative
refinement and by GMRES-IR where plain refinement stalls; clear errors for what cannot be
refined."""

import pytest
import torch

from hpctrain.errors import UserError
from hpctrain.bench.linalg import (FP64_EPS, NotRefinable, _solve_factored, backward_error,
                             conditioned_matrix, lu_factor, round_to, solve)


@pytest.fixture
def rhs():
    return torch.randn(128, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_rounding_keeps_each_precisions_mantissa():
    x = torch.tensor([1 + 2 ** -10, 1 + 2 ** -12, 1 + 2 ** -7, 1 + 2 ** -9])
    assert round_to(x, "tf32").tolist() == [1 + 2 ** -10, 1.0, 1 + 2 ** -7, 1 + 2 ** -9]
    assert round_to(x, "bf16").tolist() == [1.0, 1.0, 1 + 2 ** -7, 1.0]
    assert round_to(x, "fp16").tolist() == [1 + 2 ** -10, 1.0, 1 + 2 ** -7, 1 + 2 ** -9]


def test_the_blocked_lu_factors_the_permuted_matrix():
    A = conditioned_matrix(150, 1e2)  # three blocks of 64: panels, swaps and trailing updates
    work, order = lu_factor(A, "fp32")
    lower = torch.tril(work, -1) + torch.eye(150)
    upper = torch.triu(work)
    assert sorted(order.tolist()) == list(range(150))
    assert (lower @ upper - A[order].float()).abs().max() < 1e-5


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_a_well_conditioned_system_reaches_fp64_backward_error(precision, rhs):
    A = conditioned_matrix(128, 10.0)
    solution = solve(A, rhs, precision)
    reference = torch.linalg.solve(A, rhs)
    assert solution.backward_error <= 128 * FP64_EPS
    assert solution.backward_error <= 100 * max(backward_error(A, reference, rhs), FP64_EPS)
    assert (solution.x - reference).abs().max() <= 1e-12 * reference.abs().max()
    assert solution.method == "refinement" and solution.iterations <= 10
    assert solution.history[-1] == solution.backward_error


def test_gmres_ir_recovers_a_system_plain_refinement_cannot(rhs):
    """bf16 factors (unit roundoff 2^-8) of a matrix of condition 1e4: kappa x u is far above
    1, so plain refinement stalls far from fp64, and GMRES-IR with the same factors gets
    there."""
    A = conditioned_matrix(128, 1e4)
    factors = lu_factor(A, "bf16")
    x = _solve_factored(factors, rhs)
    for _ in range(30):
        x = x + _solve_factored(factors, rhs - A @ x)
    assert backward_error(A, x, rhs) > 1e3 * 128 * FP64_EPS
    solution = solve(A, rhs, "bf16")
    assert solution.method == "gmres-ir" and solution.backward_error <= 128 * FP64_EPS


def test_what_cannot_be_refined_is_a_clear_error(rhs):
    with pytest.raises(NotRefinable, match="too ill-conditioned for factors in fp16.*its "
                                           "condition number is .*solve in fp64"):
        solve(conditioned_matrix(128, 1e12), rhs, "fp16")
    with pytest.raises(NotRefinable, match="condition number is 5.1e\\+10, beyond what "
                                           "refinement from fp32 factors is assured.*solve in "
                                           "fp64"):  # it named fp32, whose kappa x u is 3e3
        solve(conditioned_matrix(64, 1e10), rhs[:64], "fp16")
    singular = torch.randn(128, 128, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(2))
    singular[:, 5] = singular[:, 7]
    with pytest.raises(NotRefinable, match="A is singular to fp64 precision"):
        solve(singular, rhs, "fp32")
    with pytest.raises(NotRefinable, match="a zero pivot in column 0"):
        solve(torch.zeros(4, 4), torch.ones(4), "fp32")
    with pytest.raises(UserError, match="factor_precision='fp8'"):
        solve(conditioned_matrix(4, 2.0), torch.ones(4), "fp8")
    with pytest.raises(UserError, match=r"A must be square \(n, n\) and b \(n,\)"):
        solve(torch.ones(3, 4), torch.ones(3))


def test_the_test_matrices_have_the_condition_asked_for():
    for condition in (1e2, 1e8):
        assert torch.linalg.cond(conditioned_matrix(64, condition)).item() == \
            pytest.approx(condition, rel=1e-3)


def test_bench_solve_shows_refinement_reaching_fp64_and_where_it_stops(run_cli):
    import json

    code, out, err = run_cli("bench", "solve", "--size", "64", "--conditions", "1e1,1e12",
                             "--precisions", "fp32,bf16", "--repeats", "1", "--json")
    assert code == 0, err
    rows = {(r["condition"], r["solver"]): r for r in json.loads(out)}
    assert rows[(10.0, "fp64")]["ratio"] == 1.0
    for precision in ("fp32", "bf16"):
        row = rows[(10.0, precision)]
        assert row["backward_error"] <= 64 * FP64_EPS and row["method"] == "refinement"
        assert row["ratio"] == pytest.approx(row["seconds"] / rows[(10.0, "fp64")]["seconds"])
    assert rows[(1e12, "bf16")]["method"] == "refused"
    code, out, _ = run_cli("bench", "solve", "--size", "32", "--conditions", "1e2",
                           "--repeats", "1")
    assert code == 0 and "LAPACK/cuSOLVER" in out and "refinement" in out


@pytest.mark.parametrize("arguments, message", [
    (["--precisions", "fp8"], "--precisions fp8: use fp16, bf16, tf32, fp32"),
    (["--conditions", "big"], "--conditions big: numbers of at least 1"),
    (["--conditions", "0.5"], "--conditions 0.5"),
])
def test_bench_solve_refuses_bad_input(run_cli, arguments, message):
    code, _, err = run_cli("bench", "solve", "--size", "8", *arguments)
    assert code == 2 and message in err


def test_bench_solve_refuses_a_device_it_cannot_use(run_cli, monkeypatch):
    code, _, err = run_cli("bench", "solve", "--size", "8", "--device", "tpu")
    assert code == 2 and "--device tpu: use cpu, cuda or cuda:N" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run_cli("bench", "solve", "--size", "8", "--device", "cuda")
    assert code == 2 and "--device cuda: no CUDA device here" in err


def test_b_zero_is_solved_by_x_zero():
    """It was refused as singular (the check divided by ||b|| = 0)."""
    solution = solve(conditioned_matrix(32, 10.0), torch.zeros(32, dtype=torch.float64))
    assert torch.equal(solution.x, torch.zeros(32, dtype=torch.float64))
    assert solution.backward_error == 0.0 and solution.method == "b = 0"


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32", "fp32"])
def test_a_rank_deficient_a_with_b_in_its_range_is_refused(precision):
    """Rank 63 of 64, b = A x0: refinement reached a backward error of 1e-15 and returned one
    of infinitely many solutions as the solution."""
    generator = torch.Generator().manual_seed(0)
    left, right = (torch.randn(64, 63, generator=generator, dtype=torch.float64)
                   for _ in range(2))
    A = left @ right.T
    b = A @ torch.randn(64, generator=generator, dtype=torch.float64)
    with pytest.raises(NotRefinable, match="A is rank-deficient: rank 63 of 64 in fp64.*even "
                                           "with b in A's range"):
        solve(A, b, precision)


def test_an_ill_conditioned_but_regular_system_still_solves():
    """The rank check settles a suspicious probe by A's singular values: kappa 1e8 passes."""
    A = conditioned_matrix(128, 1e8)
    b = A @ torch.ones(128, dtype=torch.float64)
    assert solve(A, b, "fp32").backward_error <= 128 * FP64_EPS


@pytest.mark.parametrize("where, value, message", [
    ("A", float("nan"), "A holds NaN at row 3, column 5 \\(1 entry NaN or Inf in all\\)"),
    ("A", float("-inf"), "A holds -Inf at row 3, column 5"),
    ("b", float("inf"), "b holds \\+Inf at entry 3"),
])
def test_nan_or_inf_in_the_input_is_named(where, value, message):
    """It was "singular to the factor precision (a zero pivot in column -1)"."""
    A, b = conditioned_matrix(16, 10.0), torch.ones(16, dtype=torch.float64)
    if where == "A":
        A[3, 5] = value
    else:
        b[3] = value
    with pytest.raises(NotRefinable, match=message):
        solve(A, b)


def test_fp16_overflow_is_named_with_the_bf16_and_scaling_hints():
    A = conditioned_matrix(32, 10.0) * 1e6
    b = torch.ones(32, dtype=torch.float64)
    with pytest.raises(NotRefinable, match="overflows fp16 \\(its largest number is 65504\\): "
                                           "factor in bf16.*scale A \\(and b\\) by a power of 2"):
        solve(A, b, "fp16")
    assert solve(A, b, "bf16").backward_error <= 32 * FP64_EPS
    # Wilkinson's matrix: entries of 1, but partial pivoting doubles its last column's with
    # each column, past fp16's range by the first trailing update (64 columns: 2^63)
    growth = torch.eye(80, dtype=torch.float64) - torch.tril(torch.ones(80, 80), -1)
    growth[:, -1] = 1
    with pytest.raises(NotRefinable, match="the LU factorisation overflowed fp16's range at "
                                           "column 64"):
        solve(growth, torch.ones(80, dtype=torch.float64), "fp16")
