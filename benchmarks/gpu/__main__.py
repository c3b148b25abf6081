"""Every GPU figure in one call (issue 28), for a machine with no network and minutes of device time.

Sections, in this order (--sections picks), each printed as it finishes and saved to --out/gpu.json; one not
begun by --deadline seconds is skipped, so a call ends inside its limit:
  loo      closed-form LOO marginals against the literal definition on the GPU, B up to 4096, G up to 128
  replicas one 1024 x 6 rollout step through SetpoShaper (MiniLM, float16): one service as the plug-ins send
           today, against requests in flight to one service, to two on the same GPU, to two at half the token
           budget (replicas.py)
  qwen-replicas  the qwen model's --qwen-prompts x 6 step through SetpoShaper, one service against two on the same
           GPU (replicas.py), each at --replica-budget tokens a batch
  qwen     a Qwen3-Embedding-0.6B-shaped model (qwen_shaped.py: its architecture, random weights) through the
           server path below, bfloat16, on --qwen-prompts x 6 rollout texts (default the whole 1024 x 6 step),
           against in-process encode at batch 32; rounds that would end past --deadline are not begun
  service  /v1/diversity (a real setpo-server on 127.0.0.1) against in-process SentenceTransformer.encode of the
           same texts, MiniLM in float16 and bfloat16: the three `make bench` workloads, and a rollout (1024
           prompts x 6 responses of 500-4000 tokens) sent as the plug-ins send it (SetpoShaper.score: texts cut
           to what the model reads, packed into requests under the service's limits). Interleaved rounds; the
           paired ratio is the median of each round's own ratio. In-process runs at batch 32 (its default) and 256.
  stages   where the service's time goes: its own parse, tokenize, pad and forward, timed one at a time on the
           rollout (stages.py)
  arenas   Backend.tokenize of the rollout in fresh processes: the CPU service's one glibc heap against glibc's
           default (stages.py)
  sweep    SETPO_MAX_BATCH_TOKENS swept on a --sweep-prompts x 6 rollout and gsm8k-384 (float16): the CUDA default
           from measurement
Token counts are the embedder's tokenizer's, after truncation to what the model reads.

Here, once: `.venv/bin/python -m benchmarks.gpu.prepare` (writes .gpu/). There, with .gpu carried:
    bash benchmarks/gpu/run.sh $OUT [DEADLINE_S]    (installs the wheels, a toy check, then this module)
--quick runs every section at toy sizes (on a CPU too): it checks the script, it measures nothing.
"""

import argparse
import json
import platform
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

from benchmarks import loo_closed_form
from benchmarks.gpu import qwen_shaped, replicas, stages, sync
from benchmarks.http_vs_inprocess import chars_per_token, rollout, workloads
from setpo_client import SetpoClient
from setpo_client.shaping import SetpoShaper, text_chars
from setpo_server.local import LocalServer

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def token_count(model, texts: list[str]) -> int:
    """Tokens the model reads of these texts (special tokens included, cut at its max_seq_length)."""
    ids = model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
    return sum(map(len, ids))


def forward_seconds(url: str) -> float:
    """The service's own total of forward-thread time (pad, forward, normalise: setpo_forward_seconds)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text)
    family = next(f for f in families if f.name == "setpo_forward_seconds")
    return next(sample.value for sample in family.samples if sample.name.endswith("_sum"))


def cut_for(client: SetpoClient, groups: list[list[str]]) -> list[list[str]]:
    """The texts as the plug-ins send them (SetpoShaper's own cut, from the server's /info), so both sides embed
    the same."""
    limit = text_chars(client.info())
    return [[text[:limit] for text in group] for group in groups]


def compare(
    model_dir: Path,
    dtype: str,
    device: str,
    chosen: dict,
    rounds: int,
    batches: list[int],
    until: float | None = None,
    **settings,
) -> list:
    """setpo-server against in-process encode, interleaved: one row per workload. A round that would end past
    `until` (time.monotonic(), judged by the round before) is not begun; the first always runs."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=device, model_kwargs={"dtype": DTYPES[dtype]})
    rows = []
    with (
        LocalServer(model=model_dir, device=device, dtype=dtype, **settings) as server,
        SetpoClient(server.url, timeout=600) as client,
    ):
        shaper = SetpoShaper(client, weight=0.05)
        for name, groups in chosen.items():
            groups = cut_for(client, groups)
            texts = [t for g in groups for t in g]
            tokens = token_count(model, texts)
            served: Callable[[list[list[str]]], object]
            if name.startswith("rollout"):  # a training step: the plug-ins' own path, several requests
                served = shaper.score
            else:  # one request, as the CPU benchmark (docs/benchmarks.md, "Method")
                served = lambda part: client.diversity([{"texts": g} for g in part])  # noqa: E731
            served(groups[:64])  # warm both paths (a whole 1024 x 6 step of a 0.6B model would take minutes)
            model.encode(texts[:64], batch_size=32)
            times: dict[str, list[float]] = {"http": [], **{f"batch{b}": [] for b in batches}}
            forward_before = forward_seconds(server.url)
            for round_ in range(rounds):
                round_began = time.monotonic()
                for batch in batches:
                    start = time.perf_counter()
                    model.encode(texts, batch_size=batch, convert_to_tensor=True, normalize_embeddings=True)
                    sync()
                    times[f"batch{batch}"].append(time.perf_counter() - start)
                start = time.perf_counter()
                served(groups)
                times["http"].append(time.perf_counter() - start)
                last = time.monotonic() - round_began
                print(
                    f"  {name} round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()),
                    flush=True,
                )
                if round_ + 1 < rounds and until is not None and time.monotonic() + last > until:
                    print(f"  {name}: {round_ + 1} of {rounds} rounds, the next would end past --deadline", flush=True)
                    break
            if shaper.fallback_steps:  # a step that fell back to lambda = 0 sent nothing: its time means nothing
                raise RuntimeError(f"{name}: {shaper.fallback_steps} step(s) fell back; see the service's log")
            best = min((f"batch{b}" for b in batches), key=lambda k: statistics.median(times[k]))
            row = {
                "workload": name,
                "dtype": dtype,
                "texts": len(texts),
                "tokens": tokens,
                **{f"{k}_tok_s": tokens / statistics.median(v) for k, v in times.items()},
                "rounds": len(times["http"]),
                "http_s_rounds": times["http"],
                f"{best}_s_rounds": times[best],
                "paired_http_over_best": statistics.median(b / h for b, h in zip(times[best], times["http"])),
                "best_inprocess": best,
                # the rest of the service's time is tokenising, JSON, queueing and the client: where to look first
                "forward_share": (forward_seconds(server.url) - forward_before) / sum(times["http"]),
                **settings,
            }
            print(
                f"  {name:<12} {dtype:<9} {len(texts):>5} texts {tokens / len(texts):>6.0f} tok/text  "
                + "  ".join(f"{k} {row[f'{k}_tok_s']:>10.0f} tok/s" for k in times)
                + f"  http/{best} {row['paired_http_over_best']:.3f}  forward {row['forward_share']:.0%} of http",
                flush=True,
            )
            rows.append(row)
    return rows


def measure(section: str, args: argparse.Namespace, device: str, bench: dict, qwen_texts: list, began: float) -> list:
    minilm = args.assets / "minilm-f16"
    if section == "loo":
        batches, sizes = ([1, 64], [3, 16]) if args.quick else ([1, 64, 4096], [3, 6, 16, 64, 128])
        rows = loo_closed_form.measure(batches, sizes, 0.05 if args.quick else 0.2, device)
        loo_closed_form.print_table(rows)
        return rows
    if section == "service":
        dtypes = args.service_dtypes if device == "cuda" else ["float32"]
        return [row for dtype in dtypes for row in compare(minilm, dtype, device, bench, args.rounds, [32, 256])]
    if section in ("qwen", "qwen-replicas"):
        dtype = "bfloat16" if device == "cuda" else "float32"
        shape = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128} if args.quick else {}
        folder = qwen_shaped.build(Path(tempfile.mkdtemp(prefix="qwen3-shaped-")), minilm, 8192, DTYPES[dtype], **shape)
        if section == "qwen-replicas":
            one_or_two = [replicas.ARRANGEMENTS[0], replicas.ARRANGEMENTS[2]]
            return [replicas.measure(folder, device, dtype, qwen_texts, args.rounds, args.replica_budget, one_or_two)]
        chosen = {"rollout-qwen": qwen_texts}
        until = began + args.deadline
        return [
            row
            for budget in args.qwen_budgets
            for row in compare(folder, dtype, device, chosen, args.rounds, [32], until, max_batch_tokens=budget)
        ]
    if section == "replicas":
        dtype = "float16" if device == "cuda" else "float32"
        return [replicas.measure(minilm, device, dtype, bench["rollout"], args.rounds, args.replica_budget)]
    if section == "stages":
        dtype = "float16" if device == "cuda" else "float32"
        return [
            stages.measure(str(minilm), device, dtype, bench["rollout"], [2048] if args.quick else args.sweep_budgets)
        ]
    if section == "arenas":
        return [stages.arenas(str(minilm), bench["rollout"], args.rounds)]
    if section == "sweep":
        dtype = "float16" if device == "cuda" else "float32"
        chosen = {"rollout": bench["rollout"][: args.sweep_prompts], "gsm8k-384": bench["gsm8k-384"]}
        rows = []
        for budget in [2048, 8192] if args.quick else args.sweep_budgets:
            if time.monotonic() - began > args.deadline:
                print(f"  budget {budget}: skipped, past --deadline", flush=True)
                continue
            rows += compare(minilm, dtype, device, chosen, 2, [32], max_batch_tokens=budget)
        return rows
    raise ValueError(f"unknown section {section!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", type=Path, default=Path(".gpu"), help="what benchmarks.gpu.prepare wrote")
    parser.add_argument("--out", type=Path, default=Path("out/gpu"))
    parser.add_argument(
        "--sections",
        nargs="*",
        default=["loo", "replicas", "qwen", "qwen-replicas", "stages", "arenas", "service", "sweep"],
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=400, help="seconds: a section not begun by then is skipped")
    parser.add_argument("--qwen-prompts", type=int, default=1024, help="rollout prompts (x 6 responses) for qwen")
    parser.add_argument("--replica-budget", type=int, default=16384, help="max_batch_tokens of replicas' services")
    parser.add_argument("--qwen-budgets", type=int, nargs="+", default=[16384], help="max_batch_tokens for qwen")
    parser.add_argument("--service-dtypes", nargs="+", default=["float16", "bfloat16"], help="service, on CUDA")
    parser.add_argument("--sweep-prompts", type=int, default=256, help="rollout prompts (x 6 responses) for sweep")
    parser.add_argument(
        "--sweep-budgets", type=int, nargs="+", default=[8192, 16384, 32768, 65536, 131072], help="sweep and stages"
    )
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks the script, measures nothing")
    args = parser.parse_args()
    began = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick,
    }
    print(json.dumps(report), flush=True)
    rows = [json.loads(line) for line in (args.assets / "gsm8k.jsonl").open()]
    from sentence_transformers import SentenceTransformer

    tokenizer_model = SentenceTransformer(str(args.assets / "minilm-f16"), device="cpu")
    per_token = chars_per_token(tokenizer_model.tokenizer, rows)
    # toy texts when quick: a CPU attends over a padded batch in memory quadratic in its length
    prompts, qwen_prompts, tokens = (8, 4, (50, 200)) if args.quick else (1024, args.qwen_prompts, (500, 4000))
    bench = workloads(rows)
    if args.quick:
        bench = {name: groups[:4] for name, groups in bench.items()}
    bench["rollout"] = rollout(rows, per_token, prompts=prompts, tokens=tokens)
    qwen_texts = rollout(rows, per_token, prompts=qwen_prompts, tokens=tokens)

    for section in args.sections:
        if time.monotonic() - began > args.deadline:
            print(f"== {section}: skipped, past --deadline {args.deadline:.0f} s", flush=True)
            continue
        print(f"== {section} ({time.monotonic() - began:.0f} s in)", flush=True)
        try:
            report[section] = measure(section, args, device, bench, qwen_texts, began)
        except Exception:  # one broken section must not cost the others their device time
            traceback.print_exc()
            report.setdefault("failed", {})[section] = traceback.format_exc()
        (args.out / "gpu.json").write_text(json.dumps(report, indent=1))
    print(f"== done in {time.monotonic() - began:.0f} s; {args.out / 'gpu.json'}", flush=True)
    if "failed" in report:
        raise SystemExit(f"sections failed: {', '.join(report['failed'])}")


if __name__ == "__main__":
    main()
