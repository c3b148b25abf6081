"""The experiment's finished runs, kept in the repository so that the full form can run over several sittings.

A sitting on this project's machine ends after three hours and the full form takes longer (docs/experiments.md).
`save` copies what the report reads of every finished run under --out (its train summary and log, and its
evaluation's summary and samples; the big files gzipped; not its model) to experiments/countdown_lm/results;
`restore` copies them back, so that `python -m experiments.countdown_lm --out ...` skips those runs and goes on
with the rest.

    python -m experiments.countdown_lm.keep save --out out/countdown_lm
    python -m experiments.countdown_lm.keep restore --out out/countdown_lm
"""

import argparse
import gzip
import shutil
from pathlib import Path

KEPT = Path(__file__).parent / "results"


def finished(out: Path) -> list[Path]:
    """The evaluation folders (eval/base-*, runs/<config>/seed<n>/eval-*) whose summary is written: done."""
    return sorted(
        summary.parent for summary in out.glob("**/summary.json") if summary.parent.name.startswith(("eval-", "base-"))
    )


def pack(plain: Path, packed: Path) -> None:
    # mtime 0: the same samples pack to the same bytes, so saving a kept run again changes nothing in git
    with plain.open("rb") as source, packed.open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as target:
        shutil.copyfileobj(source, target)


def unpack(packed: Path, plain: Path) -> None:
    with gzip.open(packed, "rb") as source, plain.open("wb") as target:
        shutil.copyfileobj(source, target)


def save(out: Path, kept: Path = KEPT) -> int:
    done = finished(out)
    for evaluated in done:
        target = kept / evaluated.relative_to(out)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(evaluated / "summary.json", target / "summary.json")
        pack(evaluated / "samples.jsonl", target / "samples.jsonl.gz")
        run = evaluated.parent
        if (run / "train_summary.json").exists():  # a run's; the base model's evaluations have none
            shutil.copy2(run / "train_summary.json", target.parent / "train_summary.json")
            pack(run / "log_history.json", target.parent / "log_history.json.gz")
    return len(done)


def restore(out: Path, kept: Path = KEPT) -> int:
    restored = 0
    for summary in sorted(kept.glob("**/summary.json")):
        evaluated = out / summary.parent.relative_to(kept)
        if (evaluated / "summary.json").exists():
            continue  # run here already: what is on disk wins
        evaluated.mkdir(parents=True, exist_ok=True)
        unpack(summary.parent / "samples.jsonl.gz", evaluated / "samples.jsonl")
        run = summary.parent.parent
        if (run / "train_summary.json").exists():
            shutil.copy2(run / "train_summary.json", evaluated.parent / "train_summary.json")
            unpack(run / "log_history.json.gz", evaluated.parent / "log_history.json")
        shutil.copy2(summary, evaluated / "summary.json")  # last: a summary on disk means the run is done
        restored += 1
    return restored


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("--out", type=Path, default=Path("out/countdown_lm"))
    args = parser.parse_args(argv)
    count = save(args.out) if args.action == "save" else restore(args.out)
    print(f"{args.action}: {count} evaluations ({KEPT} <-> {args.out})")


if __name__ == "__main__":
    main()
