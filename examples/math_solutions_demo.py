"""Demo: six sampled solutions to one math problem, three of them the same approach.

Asks the setpo service at $SETPO_URL (or, when that is unset, a setpo-server it starts on the embedded model and
stops afterwards) for the group's leave-one-out marginals and shaped advantages (lambda = 0.05, the paper's GRPO
setting), and prints them. The three
copies of the common approach share the credit and get the least; the rare approaches get the most.
"""

import os
from contextlib import nullcontext

from setpo_client import SetpoClient
from setpo_server.local import LocalServer

PROBLEM = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell altogether?"
SOLUTIONS = [  # (approach, text, reward)
    (
        "half, then add",
        "In May she sold half of 48, which is 48 / 2 = 24 clips. Altogether she sold 48 + 24 = 72 clips. The answer is 72.",
        1.0,
    ),
    ("half, then add", "Half of 48 is 24, so in May she sold 24 clips. In total: 48 + 24 = 72. The answer is 72.", 1.0),
    (
        "half, then add",
        "May sales were 48 / 2 = 24. Adding April and May gives 48 + 24 = 72 clips. The answer is 72.",
        1.0,
    ),
    (
        "multiply by 1.5",
        "May adds another half of April, so the total is 1.5 times April: 1.5 * 48 = 72. The answer is 72.",
        1.0,
    ),
    (
        "algebra",
        "Let a = 48 be April's sales and m = a/2 May's. Then a + m = 3a/2 = 3 * 48 / 2 = 72. The answer is 72.",
        1.0,
    ),
    (
        "wrong: doubled",
        "She sold twice as many in May: 48 * 2 = 96, so 48 + 96 = 144 clips in total. The answer is 144.",
        0.0,
    ),
]


def main() -> None:
    print(f"Problem: {PROBLEM}\n")
    url = os.environ.get("SETPO_URL")
    if url:
        print(f"Using the setpo service at {url} (SETPO_URL)")
    else:
        print("SETPO_URL is not set: starting setpo-server on the embedded all-MiniLM-L6-v2 ...")
    with LocalServer() if not url else nullcontext() as server, SetpoClient(url or server.url) as setpo:
        result = setpo.diversity(
            [{"texts": [text for _, text, _ in SOLUTIONS], "rewards": [r for _, _, r in SOLUTIONS]}], weight=0.05
        )
    group = result.groups[0]
    print(f"set score D(S) = {group.set_score:.4f}\n")
    print(f"{'#':>2}  {'approach':<16} {'reward':>6} {'local mass':>10} {'marginal s_i':>13} {'advantage A^':>13}")
    for i, ((approach, _, reward), mass, marginal, advantage) in enumerate(
        zip(SOLUTIONS, group.local_mass, group.marginals, group.advantages)
    ):
        print(f"{i + 1:>2}  {approach:<16} {reward:>6.1f} {mass:>10.3f} {marginal:>13.5f} {advantage:>13.5f}")
    repeated = [m for (approach, _, _), m in zip(SOLUTIONS, group.marginals) if approach == "half, then add"]
    others = [m for (approach, _, _), m in zip(SOLUTIONS, group.marginals) if approach != "half, then add"]
    verdict = (
        "the repeated approach gets the least credit"
        if max(repeated) < min(others)
        else "note: the repeated approach is NOT lowest"
    )
    print(f"\n{verdict}: max s over its 3 copies = {max(repeated):.5f} < min s over the rest = {min(others):.5f}")
    print("Among the correct answers, lambda * s_i moves the advantage toward the rare approaches.")


if __name__ == "__main__":
    main()
