"""What the service's embedder sees: for each test puzzle, the base model's distinct correct solutions, scored
as the model writes them (worded plan, steps, answer) and as bare expressions. If the bare expressions look
alike to the embedder (high similarity, saturation near 1) while the written responses do not, the plan is
what lets SetPO tell solutions apart."""

from pathlib import Path
from statistics import fmean, pstdev

from setpo_client import SetpoClient
from setpo_trainer.packaged_data import read_jsonl
from setpo_trainer.rewards import extract_expression


def embedder_view(samples: Path, url: str, most: int = 8) -> dict:
    """Mean pairwise similarity and saturation (share of pairs above 0.95) of up to `most` distinct correct
    solutions per puzzle (puzzles with at least 3), for the written responses and the bare expressions."""
    by_puzzle: dict[str, dict[str, str]] = {}
    for _, row in read_jsonl(samples):
        if row["correct"]:
            by_puzzle.setdefault(row["problem_id"], {}).setdefault(row["answer"], row["response"])
    groups = [list(solutions.values())[:most] for solutions in by_puzzle.values() if len(solutions) >= 3]
    if not groups:
        return {"puzzles": 0}
    view = {"puzzles": len(groups)}
    with SetpoClient(url) as client:
        for name, texts in (("response", groups), ("expression", [[extract_expression(t) for t in g] for g in groups])):
            scored = client.diversity([{"texts": g} for g in texts]).groups
            view[f"{name}_similarity"] = fmean(fmean(g.local_mass) for g in scored)
            view[f"{name}_saturation"] = fmean(g.saturation for g in scored)
    return view


def marginal_alignment(samples: Path, url: str, group_size: int = 8) -> dict:
    """Does s_i reward a different solution? The samples of each puzzle cut into groups of `group_size` (as in
    training); each member's s_i, standardised within its group, averaged over members whose expression is the
    only one of its kind in the group and over members that share their expression with another member."""
    by_puzzle: dict[str, list[str]] = {}
    for _, row in read_jsonl(samples):
        by_puzzle.setdefault(row["problem_id"], []).append(row["response"])
    groups = [
        texts[i : i + group_size]
        for texts in by_puzzle.values()
        for i in range(0, len(texts) - group_size + 1, group_size)
    ]
    unique, shared = [], []
    with SetpoClient(url) as client:
        for start in range(0, len(groups), 64):
            batch = groups[start : start + 64]
            for texts, scored in zip(batch, client.diversity([{"texts": g} for g in batch]).groups):
                mean, spread = fmean(scored.marginals), pstdev(scored.marginals) or 1.0
                keys = ["".join((extract_expression(t) or t).split()) for t in texts]
                for key, s in zip(keys, scored.marginals):
                    (unique if keys.count(key) == 1 else shared).append((s - mean) / spread)
    return {
        "groups": len(groups),
        "unique_members": len(unique),
        "shared_members": len(shared),
        "unique_s_z": fmean(unique) if unique else None,
        "shared_s_z": fmean(shared) if shared else None,
    }


if __name__ == "__main__":
    # python -m experiments.countdown_lm.embedder_view out/countdown_lm/eval/base/samples.jsonl [more ...]
    import sys

    from setpo_server.local import LocalServer

    with LocalServer(threads=1) as server:
        for path in sys.argv[1:]:
            print(path, embedder_view(Path(path), server.url), marginal_alignment(Path(path), server.url))
