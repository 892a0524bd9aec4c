"""`hpctrain bench solve`: mixed-precision iterative refinement (hpctrain.bench.linalg.solve)
against torch.linalg.solve in fp64, over condition numbers 1e1 to 1e12: the time of each and
the backward error each reaches, per factor precision. The baseline is the fp64 solve.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from hpctrain.bench.timing import best_of
from hpctrain.bench.linalg import NotRefinable, backward_error, conditioned_matrix, solve

CONDITIONS = (1e1, 1e3, 1e6, 1e9, 1e12)


@dataclass
class Row:
    condition: float
    solver: str  # "fp64" (torch.linalg.solve) or the factor precision
    seconds: float | None  # the best of the repeats
    backward_error: float | None
    iterations: int | None = None
    method: str | None = None  # refinement | gmres-ir | refused
    ratio: float | None = None  # seconds / the fp64 solve's

    def to_json(self) -> dict:
        return asdict(self)


def bench_solve(size: int, precisions: list[str], conditions=CONDITIONS, repeats: int = 3,
                device: str = "cpu") -> list[Row]:
    where = torch.device(device)
    b = torch.randn(size, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1)).to(where)
    rows = []
    for condition in conditions:
        A = conditioned_matrix(size, condition, device=where)
        seconds, x = best_of(lambda: torch.linalg.solve(A, b), repeats, where)
        rows.append(Row(condition, "fp64", seconds, backward_error(A, x, b), ratio=1.0))
        for precision in precisions:
            try:
                spent, found = best_of(lambda: solve(A, b, precision), repeats, where)
            except NotRefinable:
                rows.append(Row(condition, precision, None, None, method="refused"))
                continue
            rows.append(Row(condition, precision, spent, found.backward_error,
                            found.iterations, found.method, spent / seconds))
    return rows


def text(rows: list[Row], size: int, device: str) -> str:
    lines = [f"Ax = b, n = {size}, on {device}: torch.linalg.solve in fp64 against LU in a "
             "lower precision refined to fp64",
             f"{'condition':>10}  {'solver':<7}{'seconds':>10}{'x fp64':>8}"
             f"{'backward error':>16}{'steps':>7}  method"]
    for row in rows:
        seconds = f"{row.seconds:.4f}" if row.seconds is not None else "-"
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        error = f"{row.backward_error:.1e}" if row.backward_error is not None else "-"
        steps = str(row.iterations) if row.iterations is not None else "-"
        lines.append(f"{row.condition:>10.0e}  {row.solver:<7}{seconds:>10}{ratio:>8}"
                     f"{error:>16}{steps:>7}  {row.method or 'LAPACK/cuSOLVER'}")
    return "\n".join(lines)
