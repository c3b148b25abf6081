"""Records what TRL itself computed and what its loss then received, wrapping GRPOTrainer's real methods.
Used by the in-process tests (through monkeypatch) and by each process of the two-process run."""

from collections.abc import Callable

from trl import GRPOTrainer


def install(patch: Callable = setattr) -> dict[str, list]:
    """Wraps the methods with `patch(owner, name, value)`: pass monkeypatch.setattr to have them restored.
    Returns {"trl": [(advantages, texts) per generated batch], "loss": [{text: advantage} per loss batch]}."""
    seen: dict[str, list] = {"trl": [], "loss": []}
    generate, loss = GRPOTrainer._generate_and_score_completions, GRPOTrainer.compute_loss

    def record_generate(self, inputs):
        output = generate(self, inputs)
        texts = self.processing_class.batch_decode(output["completion_ids"], skip_special_tokens=True)
        seen["trl"].append((output["advantages"].clone(), texts))
        return output

    def record_loss(self, model, inputs, *args, **kwargs):
        # TRL shuffles a generated batch before the loss: keep each advantage with its completion
        texts = self.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
        seen["loss"].append(dict(zip(texts, inputs["advantages"].tolist())))
        return loss(self, model, inputs, *args, **kwargs)

    patch(GRPOTrainer, "_generate_and_score_completions", record_generate)
    patch(GRPOTrainer, "compute_loss", record_loss)
    return seen
