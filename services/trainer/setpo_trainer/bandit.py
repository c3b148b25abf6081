"""The paper's toy bandit (section 1, Fig. 1): does SetPO keep rewarded modes alive where GRPO collapses?

Twelve semantic modes, each a fixed 50-d embedding; the first four are rewarded. A response is a mode plus a
little noise (paraphrases of one approach are close, not identical). The policy is a softmax over the modes.
One step is one GRPO step: for each of P prompts, sample a group of G responses, reward them, compute group
advantages, add lambda * s_i from the RUNNING setpo service (lambda = 0 is plain GRPO), and take a policy-
gradient step on the mean of A^_i * grad log pi(a_i). Reads top to bottom, CleanRL-style.

    setpo-bandit --serve --out out/bandit            # starts its own service, both methods, 3 seeds
    setpo-bandit --url http://127.0.0.1:8000 --out out/bandit --seeds 0 1 2 3 4   # or SETPO_URL=...
    setpo-bandit --serve --out out/bandit-scoped --min-reward 1 --kernel key --normalize zscore --target-ratio 0.3

The diversity policy of contract v1.1 is a flag away: --min-reward scores only rewarded responses, --kernel key or
hybrid compares them by their solution key (here: the mode a response was sampled from), --normalize zscore, and
--target-ratio steers lambda (--weight is then the first step's) to that RMS(bonus) / RMS(advantage).
"""

import argparse
import importlib.metadata
import json
import logging
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from statistics import median
from typing import Any

import torch
from tqdm import tqdm

from setpo_client import SetpoClient, SetpoError
from setpo_client.shaping import SetpoShaper
from setpo_client.weight import WeightController
from setpo_core.diversity import group_advantages

log = logging.getLogger("setpo_bandit")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="setpo-bandit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('setpo-trainer')}"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        default=os.environ.get("SETPO_URL"),
        help="a running setpo service, several replicas comma-separated (default: $SETPO_URL; with neither, one "
        "is started for the run)",
    )
    where.add_argument(
        "--serve", action="store_true", help="start a setpo service for the run (needs setpo-server installed)"
    )
    parser.add_argument("--api-key", default=None, help="the service's key (default: $SETPO_API_KEY)")
    parser.add_argument("--out", type=Path, required=True, help="directory for results.json, the table and the plot")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=8, help="groups per step (P)")
    parser.add_argument("--group-size", type=int, default=6, help="responses per group (G)")
    parser.add_argument("--modes", type=int, default=12)
    parser.add_argument("--rewarded", type=int, default=4, help="the first this many modes give reward 1")
    parser.add_argument("--dim", type=int, default=50, help="embedding dimension of a mode")
    parser.add_argument(
        "--noise",
        type=float,
        default=0.3,
        help="std of the per-response noise around its mode (mode vectors have unit-scale entries)",
    )
    parser.add_argument("--lr", type=float, default=0.5, help="policy-gradient step size on the logits")
    parser.add_argument("--weight", type=float, default=2.0, help="lambda of the SetPO run (GRPO is the same run at 0)")
    parser.add_argument("--min-reward", type=float, help="score only responses with reward >= this (default: all)")
    parser.add_argument(
        "--kernel",
        choices=["embedding", "hybrid", "key"],
        default="embedding",
        help="embedding: cosine of the responses (the paper); key / hybrid: the sampled mode is the solution key",
    )
    parser.add_argument("--normalize", choices=["none", "zscore"], default="none")
    parser.add_argument(
        "--embed-span", metavar="REGEX", help="refused here: it cuts texts, and the bandit's responses are vectors"
    )
    parser.add_argument("--target-ratio", type=float, help="steer lambda to this RMS(bonus) / RMS(advantage)")
    parser.add_argument("--min-weight", type=float, default=1e-3, help="lower bound of the steered lambda")
    parser.add_argument("--max-weight", type=float, default=10.0, help="upper bound of the steered lambda")
    parser.add_argument("--weight-ema", type=float, default=0.9, help="moving-average weight of the past lambda")
    parser.add_argument("--warmup-steps", type=int, default=0, help="steps over which the target ratio ramps up")
    parser.add_argument("--freeze-after", type=int, help="steps after which the steered lambda stays fixed")
    parser.add_argument(
        "--alive", type=float, default=0.05, help="a mode is alive at the end if its probability is at least this"
    )
    parser.add_argument(
        "--on-error",
        choices=["skip", "fail"],
        default="skip",
        help="when the service fails: train the step with lambda = 0, or stop",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds the client waits for an answer")
    parser.add_argument(
        "--in-flight", type=int, help="a step's requests in flight at once, over the replicas (default: one each)"
    )
    parser.add_argument("--verbose", action="store_true", help="log every request (httpx and others at INFO)")
    args = parser.parse_args(argv)
    if args.embed_span is not None:  # every plug-in takes the setting; here it has nothing to apply to
        parser.error("--embed-span chooses what of a text is embedded; the bandit's responses are embedding vectors")
    if args.rewarded > args.modes or args.group_size < 3 or args.steps < 1:
        parser.error("need rewarded <= modes, group-size >= 3 (leave-one-out needs 3) and steps >= 1")
    if args.in_flight is not None and args.in_flight < 1:  # refused here, not after the service has started
        parser.error(f"--in-flight must be >= 1 (requests in flight at once), got {args.in_flight}")
    try:
        controller(args)  # its settings are checked here, not after the service has started
    except ValueError as exc:
        parser.error(f"--target-ratio and its bounds: {exc}")
    return args


def train(args: argparse.Namespace, shaper: SetpoShaper, seed: int, progress: tqdm | None = None) -> dict:
    """One run. Returns per-step mode probabilities (steps + 1, modes) and per-step SetPO metrics."""
    generator = torch.Generator().manual_seed(seed)
    # The modes are the same for every seed and method; the seed changes the start and the sampling.
    modes = torch.randn(args.modes, args.dim, generator=torch.Generator().manual_seed(1234))  # (M, d)
    reward_of_mode = (torch.arange(args.modes) < args.rewarded).float()  # (M,)
    logits = 0.3 * torch.randn(args.modes, generator=generator)  # (M,) a slightly uneven start
    history, metrics = [torch.softmax(logits, 0)], []
    for _ in range(args.steps):
        probs = torch.softmax(logits, 0)
        actions = torch.multinomial(
            probs.expand(args.prompts, -1), args.group_size, replacement=True, generator=generator
        )  # (P, G)
        responses = modes[actions] + args.noise * torch.randn(
            args.prompts, args.group_size, args.dim, generator=generator
        )  # (P, G, d)
        rewards = reward_of_mode[actions]  # (P, G)
        advantages = group_advantages(rewards)  # (P, G)  GRPO's A
        step = shaper.score(  # the service's bonus; zeros for GRPO or on fallback
            responses.tolist(),
            rewards=rewards.tolist(),
            advantages=advantages.tolist(),
            keys=[[f"mode {a}" for a in group] for group in actions.tolist()],  # the solution identity
        )
        advantages = advantages + torch.tensor(step.bonus)  # (P, G)  A^ = A + lambda * s
        # grad of mean_i A^_i log pi(a_i) w.r.t. the logits: A^_i (onehot(a_i) - pi), averaged over all P*G samples
        onehot = torch.nn.functional.one_hot(actions, args.modes).float()  # (P, G, M)
        gradient = (advantages[..., None] * (onehot - probs)).mean(dim=(0, 1))  # (M,)
        logits = logits + args.lr * gradient
        history.append(torch.softmax(logits, 0))
        step.metrics["reward_mean"] = rewards.mean().item()
        metrics.append(step.metrics)
        if progress is not None:
            progress.update()
    return {"probs": torch.stack(history).tolist(), "metrics": metrics}


def run_all(args: argparse.Namespace, client: SetpoClient) -> dict[str, dict[str, dict]]:
    """GRPO and SetPO+GRPO for every seed: {method: {seed: train's result}}, one progress bar over all steps."""
    results: dict[str, dict[str, dict]] = {"grpo": {}, "setpo": {}}
    with tqdm(total=2 * len(args.seeds) * args.steps, unit="step", desc="training") as progress:
        for seed in args.seeds:
            for method, weight in (("grpo", 0.0), ("setpo", args.weight)):
                progress.set_postfix(seed=seed, method=method)
                shaper = SetpoShaper(
                    client,
                    weight=weight,
                    on_error=args.on_error,
                    min_reward=args.min_reward,
                    kernel=args.kernel,
                    normalize=args.normalize,
                    controller=controller(args) if weight > 0 else None,
                    in_flight=args.in_flight,
                )
                results[method][str(seed)] = train(args, shaper, seed, progress)
    return results


def controller(args: argparse.Namespace) -> WeightController | None:
    if args.target_ratio is None:
        return None
    return WeightController(
        args.target_ratio, args.min_weight, args.max_weight, args.weight_ema, args.warmup_steps, args.freeze_after
    )


def spell(name: str) -> str:
    return "--" + name.replace("_", "-")


def alive_rewarded(probs: list[float], args: argparse.Namespace) -> int:
    return sum(p >= args.alive for p in probs[: args.rewarded])


def plot(results: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed = str(args.seeds[0])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, method in zip(axes, ("grpo", "setpo")):
        probs = torch.tensor(results[method][seed]["probs"])  # (steps + 1, M)
        for mode in range(args.modes):
            rewarded = mode < args.rewarded
            ax.plot(
                probs[:, mode],
                lw=2 if rewarded else 1,
                ls="-" if rewarded else ":",
                label=f"mode {mode}" + (" (rewarded)" if rewarded else ""),
            )
        title = "GRPO" if method == "grpo" else f"SetPO + GRPO (lambda = {args.weight})"
        ax.set_title(f"{title}, seed {seed}")
        ax.set_xlabel("step")
    axes[0].set_ylabel("mode probability")
    axes[1].legend(fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # one line a request from httpx would bury the result: third-party loggers speak up only when asked to
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    service: AbstractContextManager[Any] = nullcontext()
    if args.serve or not args.url:
        from setpo_server.local import LocalServer  # the service's package, needed only to start one

        reason = "--serve" if args.serve else "no --url or SETPO_URL given"
        print(f"starting setpo-server on the embedded model ({reason}) ...", flush=True)
        service = LocalServer()
        args.url = None
    else:
        print(f"using the setpo service at {args.url}", flush=True)
    with service as running, SetpoClient(args.url or running.url, api_key=args.api_key, timeout=args.timeout) as client:
        try:  # what every plug-in proves at start: groups of --group-size scoreable, the service ready and taking them
            SetpoShaper(client, args.weight).start(args.group_size, spell=spell, ready_timeout=180)
        except SetpoError as exc:
            sys.exit(f"setpo-bandit: {exc}")
        results = run_all(args, client)
    rows = ["| seed | GRPO: rewarded modes alive | SetPO+GRPO: rewarded modes alive |", "|---|---|---|"]
    for seed in args.seeds:
        grpo, setpo = (alive_rewarded(results[m][str(seed)]["probs"][-1], args) for m in ("grpo", "setpo"))
        rows.append(f"| {seed} | {grpo} / {args.rewarded} | {setpo} / {args.rewarded} |")
    means = [
        sum(alive_rewarded(results[m][str(s)]["probs"][-1], args) for s in args.seeds) / len(args.seeds)
        for m in ("grpo", "setpo")
    ]
    rows.append(f"| mean | {means[0]:.2f} | {means[1]:.2f} |")
    table = "\n".join(rows)
    # the shaper measures the share from its second step on (a step is from one call to the next)
    share = [
        m["setpo/time_share"]
        for seed in args.seeds
        for m in results["setpo"][str(seed)]["metrics"]
        if "setpo/time_share" in m
    ]
    summary = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "alive_mean": {"grpo": means[0], "setpo": means[1]},
        "setpo_time_share_mean": sum(share) / len(share),
        "setpo_time_ms_median": 1e3
        * median(m["setpo/time_s"] for run in results["setpo"].values() for m in run["metrics"]),
        "runs": results,
    }
    (args.out / "results.json").write_text(json.dumps(summary))
    (args.out / "table.md").write_text(table + "\n")
    plot(results, args, args.out / "mode_probabilities.png")
    print(f"\nRewarded modes alive at the end (probability >= {args.alive}) after {args.steps} steps:\n{table}")
    print(
        f"SetPO's time per step: {summary['setpo_time_ms_median']:.0f} ms (median), "
        f"{summary['setpo_time_share_mean']:.0%} of this toy's step, whose own update takes microseconds; "
        "beside an LLM's generation and backward pass it weighs far less (measured in docs/experiments.md)"
    )
    fallbacks = sum(run["metrics"][-1]["setpo/fallback_steps"] for run in results["setpo"].values())
    if fallbacks:
        print(f"{fallbacks} SetPO steps trained with lambda = 0 because the service failed (--on-error skip)")
    print(f"wrote {args.out / 'results.json'}, {args.out / 'table.md'}, {args.out / 'mode_probabilities.png'}")


if __name__ == "__main__":
    main()
