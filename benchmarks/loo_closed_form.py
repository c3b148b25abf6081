"""Closed-form leave-one-out marginals vs the literal definition (recompute D on every subset).

The literal side is vectorised as far as the definition allows, so the ratio measures the algorithm, not
Python: for each i it rebuilds the subset S \\ {o_i} as a mask and recomputes D on it for all B groups at
once (G passes of O(B G^2), i.e. O(B G^3)). The closed form (setpo_core) is one O(B G^2) pass. Both run in
float32 on the same kernels; max error is against the literal definition in float64. For small sizes the
pure-Python reference of the tests (tests/core/reference.py) is timed too ("vs python"), as the definition
is usually implemented (the paper's Algorithm 1).

    python -m benchmarks.loo_closed_form [--quick] [--plot docs/figures/loo_speedup.png]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from setpo_core.diversity import SHAPES, cosine_kernel, set_diversity
from tests.core import reference


def literal_marginals(kernel: torch.Tensor) -> torch.Tensor:
    """s_i = D(S) - D(S minus o_i), with D recomputed from scratch on every subset. (B, G, G) -> (B, G)."""
    g = SHAPES["neg_log1p"]
    size = kernel.shape[-1]
    eye = torch.eye(size, dtype=torch.bool, device=kernel.device)

    def score(members: torch.Tensor) -> torch.Tensor:  # members (G,) bool -> D per group (B,)
        pairs = members[:, None] & members[None, :] & ~eye
        mass = torch.where(pairs, kernel, 0.0).sum(-1) / (members.sum() - 1)  # (B, G)
        return torch.where(members, g(mass), 0.0).sum(-1) / members.sum()

    everyone = torch.ones(size, dtype=torch.bool, device=kernel.device)
    full = score(everyone)
    others = torch.arange(size, device=kernel.device)
    return torch.stack([full - score(everyone & (others != i)) for i in range(size)], dim=-1)


def seconds(fn, min_time: float) -> float:
    """Median wall time of fn over repeats filling at least min_time (at least 3 runs); on a GPU each run waits
    for its kernels to finish."""
    times: list[float] = []
    while len(times) < 3 or sum(times) < min_time:
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(batches: list[int], sizes: list[int], min_time: float, device: str = "cpu") -> list[dict]:
    """One row per (B, G): closed-form and literal times, and the closed form's max error against the literal
    definition in float64. The pure-Python reference is timed on the CPU only, where it finishes in reasonable time."""
    torch.manual_seed(0)
    rows = []
    for batch in batches:
        for size in sizes:
            # responses to one prompt share a component, so similarities are large and varied
            embeddings = torch.randn(batch, size, 32, device=device) + 1.5 * torch.randn(batch, 1, 32, device=device)
            kernel = cosine_kernel(embeddings)  # (B, G, G)
            closed = seconds(lambda: set_diversity(kernel), min_time)
            literal = seconds(lambda: literal_marginals(kernel), min_time)
            error = (set_diversity(kernel).marginals.double() - literal_marginals(kernel.double())).abs().max().item()
            python = None
            if device == "cpu" and batch * size**3 <= 4096 * 16**3:
                python_rows = kernel.double().tolist()
                python = seconds(lambda: [reference.loo_marginals(k) for k in python_rows], 0.2)
            rows.append(
                {
                    "B": batch,
                    "G": size,
                    "closed_s": closed,
                    "literal_s": literal,
                    "python_s": python,
                    "max_error": error,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds of repeats per measurement")
    parser.add_argument("--plot", type=Path, help="write the speed-ups against G, one line per B, to this PNG")
    args = parser.parse_args()
    sizes = [3, 6, 16] if args.quick else [3, 6, 16, 64, 128]
    batches = [1, 64] if args.quick else [1, 64, 4096]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32")
    rows = measure(batches, sizes, args.min_time)
    print_table(rows)
    if args.plot:
        speedups: dict[tuple[str, int], list[tuple[int, float]]] = {}  # (baseline, B) -> [(G, speed-up)]
        for row in rows:
            speedups.setdefault(("literal", row["B"]), []).append((row["G"], row["literal_s"] / row["closed_s"]))
            if row["python_s"] is not None:
                speedups.setdefault(("python", row["B"]), []).append((row["G"], row["python_s"] / row["closed_s"]))
        plot(speedups, args.plot)


def print_table(rows: list[dict]) -> None:
    print(
        f"{'B':>5} {'G':>4} {'closed ms':>10} {'literal ms':>11} {'speed-up':>9} {'python ms':>10} {'vs python':>10} {'max |err|':>10}"
    )
    for row in rows:
        closed, literal, python = row["closed_s"], row["literal_s"], row["python_s"]
        python_ms, ratio = ("-", "-") if python is None else (f"{python * 1e3:.2f}", f"{python / closed:.0f}x")
        print(
            f"{row['B']:>5} {row['G']:>4} {closed * 1e3:>10.3f} {literal * 1e3:>11.3f} {literal / closed:>8.1f}x {python_ms:>10} {ratio:>10} {row['max_error']:>10.2e}"
        )


def plot(speedups: dict[tuple[str, int], list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    titles = {"python": "vs the per-subset definition (Python)", "literal": "vs the definition vectorised in torch"}
    for ax, baseline in zip(axes, ("python", "literal")):
        for (name, batch), points in sorted(speedups.items()):
            if name == baseline:
                ax.plot(*zip(*points), marker="o", label=f"B = {batch}")
        ax.set(title=titles[baseline], xlabel="group size G", xscale="log", yscale="log")
        ax.set_xticks([3, 6, 16, 64, 128], labels=["3", "6", "16", "64", "128"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].axhline(200, color="grey", linestyle="--", linewidth=1)  # the goal at 4096 x 16
    axes[0].set_ylabel("closed-form speed-up (x)")
    fig.suptitle(f"Closed-form LOO marginals, float32, torch {torch.__version__}, {torch.get_num_threads()} threads")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
