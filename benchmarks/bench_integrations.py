"""advcal inside TRL's GRPOTrainer: the cost it adds to a training step.

**Advantage step.**  ``AdvcalGRPOMixin`` lets TRL compute its own advantages, then replaces
them.  Its added work per batch (reading the gathered rewards to the host, TRL's reward
combination, advcal's advantages and the logged metrics, the tensor back) is timed by
running the mixin's ``_generate_and_score_completions`` over a parent that returns a
prepared TRL output at once, so nothing but the mixin's own code is timed.  The baseline
is TRL's own advantage computation: the lines of the installed
``GRPOTrainer._generate_and_score_completions`` from the unscorable mask to the local
slice, taken from TRL's source and run on the same gathered rewards (not a copy of its
formulas).  The host round trip is the copy of the rewards out of their tensor and of the
advantages into one (free on CPU tensors; a device sync and two copies on a GPU).

**SetGRPO.**  A trainer step's loss on the tiny Llama of the integration tests: forward
of the loss (``compute_loss``) and forward + backward, with ``advantage="setgrpo"``
(Gram matrices on the loss's own forward pass, SetGRPO's coefficients) and with
``advantage="grpo"``, on the same generated batch.
"""

from __future__ import annotations

import collections
import inspect
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import Case

G = 16
START = "unscorable_mask = torch.isnan(rewards_per_func)"
END = "advantages = advantages[process_slice]"


def _trl_block() -> Any:
    """TRL's advantage lines from the installed GRPOTrainer, compiled; None if not found."""
    from trl import GRPOTrainer

    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    first = next((i for i, line in enumerate(lines) if START in line), None)
    last = next((i for i, line in enumerate(lines) if END in line), None)
    if first is None or last is None or last < first:
        return None
    return compile(textwrap.dedent("\n".join(lines[first:last + 1])), "<trl advantages>",
                   "exec")


class _Process:
    process_index = 0
    num_processes = 1


class _Model:
    training = True


def _trainer_state(n: int, mode: str, options: dict[str, Any] | None) -> Any:
    """A mixin instance over a parent that hands back a prepared TRL output."""
    import torch

    from advcal.integrations.trl import AdvcalGRPOMixin, _settings_iv

    class Prepared:
        prepared: Any

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            return {"advantages": self.prepared}

    class Timed(AdvcalGRPOMixin, Prepared):
        pass

    state: Any = object.__new__(Timed)
    state._advcal = _settings_iv(mode, options, None, None, None, None, 0)
    state.reward_weights = torch.ones(1)
    state.multi_objective_aggregation = "sum_then_normalize"
    state.scale_rewards = "group"
    state.num_generations = G
    state.accelerator = _Process()
    state.model = _Model()
    state._metrics = {"train": collections.defaultdict(list)}
    state.prepared = torch.zeros(n)
    return state


def _advantage_case(groups: int, none_fraction: float) -> Case | None:
    import torch
    from trl.trainer.utils import nanstd

    block = _trl_block()
    if block is None:
        return None
    n = groups * G
    rng = np.random.default_rng(0)
    # Rewards on a 0.01 grid, as a graded reward function gives them; some None (NaN).
    rewards = np.round(rng.beta(2, 2, (n, 1)), 2)
    rewards[rng.uniform(size=n) < none_fraction] = np.nan
    per_func = torch.tensor(rewards, dtype=torch.float32)
    trl_self: Any = _trainer_state(n, "grpo", None)
    namespace = {"self": trl_self, "torch": torch, "nanstd": nanstd, "device": "cpu",
                 "rewards_per_func": per_func, "num_generations": G, "prompts": [None] * n}

    def trl_own() -> Any:
        exec(block, namespace)
        return namespace["advantages"]

    def advcal_step(mode: str, options: dict[str, Any] | None) -> Any:
        state = _trainer_state(n, mode, options)
        state._advcal_rewards_per_func = per_func

        def run() -> Any:
            for values in state._metrics["train"].values():
                values.clear()  # a logging step empties them too
            return state._generate_and_score_completions(None)

        return run

    out = np.zeros(n)

    def round_trip() -> Any:
        return (per_func.detach().cpu().numpy().copy(),
                torch.as_tensor(out, dtype=torch.float32))

    ours = advcal_step("grpo", None)()["advantages"]
    theirs = trl_own()
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-6)
    label = f"{groups} groups x {G}" + (f", {none_fraction:.0%} None rewards"
                                         if none_fraction else "")
    base, trip = "TRL's own advantages (its source)", "host round trip"
    timed = _Timed()
    candidates = timed.wrap({
        base: trl_own,
        trip: round_trip,
        "advcal grpo step (mixin)": advcal_step("grpo", None),
        "advcal maxnorm step (mixin)": advcal_step("maxnorm", {"tau_res": 0.05}),
        "advcal rloo step (mixin)": advcal_step("rloo", None),
    })

    def notes() -> list[str]:
        best = timed.best
        lines = [f"{name} without the round trip: {(t - best[trip]) / best[base]:.2f}x TRL's own"
                 for name, t in best.items() if name.startswith("advcal")]
        return lines + ["advcal's step runs after TRL's own (TRL still computes its "
                        "advantages); grpo mode equals TRL's within 1e-6 (checked first)"]

    return Case(f"TRL integration: advantage step, {label}", candidates, baseline=base,
                target="advcal step <= 0.5x TRL's own + the host round trip",
                notes=_Notes(notes))


def _tokenizer() -> Any:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({w: i + 4 for i, w in enumerate("a b c d e f g h i j k l".split())})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="<eos>", bos_token="<bos>",
                                                unk_token="<unk>")


def _setgrpo_case(quick: bool) -> Case:
    import datasets
    import torch
    import transformers
    import trl

    import advcal
    from advcal.integrations.trl import AdvcalGRPOTrainer

    g, prompts, length = (4, 2, 6) if quick else (8, 4, 16)
    tok = _tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    weights = transformers.LlamaForCausalLM(config).state_dict()
    words = "a b c d e f g h i j k l".split()
    texts = [" ".join(words[i:i + 3]) for i in range(prompts)]
    rng = np.random.default_rng(0)
    clean = rng.uniform(0, 1, (300, g))
    calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.02, clean.shape),
                                        clean + rng.normal(0, 0.02, clean.shape), alpha=0.2)

    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [len(c) / 20 for c in completions]

    def trainer(**kwargs: Any) -> Any:
        model = transformers.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        args = trl.GRPOConfig(
            output_dir=None, per_device_train_batch_size=g * prompts, num_generations=g,
            max_completion_length=length, max_steps=1, report_to=[], use_cpu=True,
            save_strategy="no", seed=0, disable_tqdm=True)
        out = AdvcalGRPOTrainer(model=model, reward_funcs=reward, args=args,
                                train_dataset=datasets.Dataset.from_dict({"prompt": texts}),
                                processing_class=tok, **kwargs)
        out.model.train()
        out.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
        return out

    setgrpo = {"advantage": "setgrpo", "calibration": calibration, "tau": 0.2}
    runs = {"grpo": trainer(advantage="grpo"),
            "setgrpo, every linear layer": trainer(**setgrpo),
            "setgrpo, last block": trainer(**setgrpo, gram_layers=["model.layers.1"])}
    with torch.no_grad():
        batch = runs["setgrpo, every linear layer"]._generate_and_score_completions(
            [{"prompt": text} for text in texts for _ in range(g)])

    def loss(name: str, backward: bool) -> Any:
        run = runs[name]

        def step() -> Any:
            out = run.compute_loss(run.model, dict(batch))
            if backward:
                out.backward()
                run.model.zero_grad(set_to_none=True)
            return out

        return step

    timed = _Timed()
    candidates = {}
    for name in runs:
        candidates[f"{name}: loss forward"] = loss(name, False)
        candidates[f"{name}: forward + backward"] = loss(name, True)
    base = "grpo: forward + backward"
    candidates = timed.wrap(candidates)

    def notes() -> list[str]:
        best = timed.best
        backward = best[base] - best["grpo: loss forward"]
        lines = [f"one backward pass (grpo forward + backward - grpo loss forward): "
                 f"{backward * 1e3:.2f} ms"]
        for name in runs:
            if name != "grpo":
                extra = best[f"{name}: forward + backward"] - best[base]
                lines.append(f"{name}: extra per step {extra / backward:.2f}x one backward pass")
        return lines

    return Case(
        f"TRL integration: SetGRPO step on the tiny Llama, {prompts} groups of {g}, "
        f"{length} completion tokens, one torch thread",
        candidates, baseline=base,
        target="setgrpo's extra per step (Gram included) <= one backward pass",
        notes=_Notes(notes))


class _Timed:
    """Wraps candidates to keep each one's best per-call time, for the notes."""

    def __init__(self) -> None:
        self.best: dict[str, float] = {}

    def wrap(self, candidates: dict[str, Callable[[], object]]) -> dict[str, Callable[[], object]]:
        def timed(label: str, fn: Callable[[], object]) -> Callable[[], object]:
            def run() -> object:
                start = time.perf_counter()
                out = fn()
                elapsed = time.perf_counter() - start
                self.best[label] = min(self.best.get(label, float("inf")), elapsed)
                return out
            return run
        return {label: timed(label, fn) for label, fn in candidates.items()}


class _Notes(list[str]):
    """Notes computed when the runner prints them: after the rounds."""

    def __init__(self, make: Callable[[], list[str]]) -> None:
        super().__init__()
        self.make = make

    def __iter__(self) -> Any:
        return iter(self.make())


def cases(quick: bool) -> list[Case]:
    try:
        import torch
        import trl  # noqa: F401
    except ImportError:
        return []
    torch.set_num_threads(1)  # on a shared 2-core machine torch's pool measures contention
    sizes = [(64, 0.0)] if quick else [(64, 0.0), (1024, 0.0), (1024, 0.05)]
    out = [case for case in (_advantage_case(*size) for size in sizes) if case is not None]
    return out + [_setgrpo_case(quick)]
