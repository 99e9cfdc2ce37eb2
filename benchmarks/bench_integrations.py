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
advantages into one (two memory copies here; on a GPU also a device sync and transfers).
The notes give each advcal step minus the round trip, as a paired-round median ratio.

**SetGRPO.**  A trainer step's loss on a Llama of hidden 128 and 4 blocks (the integration
tests' tiny one in quick mode), 32 completion tokens, under TRL's default settings: forward
of the loss (``compute_loss``) and forward + backward, with ``advantage="setgrpo"``
(Gram matrices on the loss's own forward pass, SetGRPO's coefficients) and with
``advantage="grpo"``, on the same generated batch, shuffled as TRL shuffles it before the
loss; one torch thread.  The extra cost
per step is set against one backward pass (grpo's forward + backward minus its forward),
in full fine-tuning and with peft LoRA adapters on every linear layer (r = 8), under TRL's
default settings; the Gram's backward pass runs before TRL's own.

**Whole steps.**  ``trainer.train()`` on the same model and sizes, GRPO and SetGRPO
(every linear layer) alternating in each round: everything a TRL step does (generation,
scoring, the loss and its backward, gradient clipping, the optimizer, TRL's bookkeeping).
A step's time is a run of 12 steps minus a run of 2, over the 10 steps between, so that
what a run pays once (building the trainer's state, the first compiles) cancels.

The cases are built only when selected (they import TRL and construct trainers).
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import inspect
import math
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import Case, Rounds, round_times

G = 16
SETGRPO_SIZES = {False: (8, 4, 32), True: (4, 2, 6)}  # (group size, groups, completion length)
# The full-size model: hidden 128, 4 blocks (the sizes at which SetGRPO's step is judged).
SETGRPO_WIDTH = {False: (128, 4), True: (16, 2)}  # (hidden size, layers)
GENERATION = "grpo: generation and scoring"
ADVANTAGE_TARGET = "advcal step <= 0.5x TRL's own + the host round trip"
SETGRPO_TARGET = "setgrpo's step <= 1.25x grpo's step under TRL's defaults (paper: +25.6%)"
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
    base, trip = "TRL's own advantages (its source)", "host round trip"
    candidates = {
        base: trl_own,
        trip: round_trip,
        "advcal grpo step (mixin)": advcal_step("grpo", None),
        "advcal maxnorm step (mixin)": advcal_step("maxnorm", {"tau_res": 0.05}),
        "advcal rloo step (mixin)": advcal_step("rloo", None),
    }

    def notes(rounds: Rounds) -> list[str]:
        # A candidate much faster than another gets rounds of its own (the round trip
        # always, a step on a small batch sometimes): then best over best.
        trip_ratio = rounds.paired_ratio(trip, base) or rounds.best(trip) / rounds.best(base)
        lines = []
        for name in candidates:
            if not name.startswith("advcal"):
                continue
            ratio = rounds.paired_ratio(name, base)
            how = "paired-round medians"
            if ratio is None:
                ratio, how = rounds.best(name) / rounds.best(base), "best over best"
            lines.append(f"{name} minus the round trip: {ratio - trip_ratio:.2f}x TRL's own "
                         f"({how})")
        return lines + ["advcal's step runs after TRL's own (TRL still computes its "
                        "advantages); grpo mode equals TRL's within 1e-6 (checked first)"]

    return Case("", candidates, baseline=base, notes=_Notes(notes))


def _trainers(quick: bool) -> tuple[Callable[..., Any], dict[str, Any], list[str]]:
    """``make(lora=False, steps=1, **options)``: an AdvcalGRPOTrainer on the benchmark's
    Llama (the same weights each time) under TRL's defaults; SetGRPO's options; the
    prompts."""
    import datasets
    import torch
    import transformers
    import trl

    import advcal
    from advcal.integrations.trl import AdvcalGRPOTrainer
    from tests.tiny_llm import WORDS, llama_config, word_tokenizer

    g, prompts, length = SETGRPO_SIZES[quick]
    tok = word_tokenizer()
    config = llama_config(tok)
    hidden, layers = SETGRPO_WIDTH[quick]
    config.hidden_size, config.intermediate_size = hidden, 2 * hidden
    config.num_hidden_layers, config.max_position_embeddings = layers, 128
    torch.manual_seed(0)
    weights = transformers.LlamaForCausalLM(config).state_dict()
    texts = [" ".join(WORDS[i:i + 3]) for i in range(prompts)]
    rng = np.random.default_rng(0)
    clean = rng.uniform(0, 1, (300, g))
    calibration = advcal.calibrate_sets(clean + rng.normal(0, 0.02, clean.shape),
                                        clean + rng.normal(0, 0.02, clean.shape), alpha=0.2)

    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [len(c) / 20 for c in completions]

    def make(lora: bool = False, steps: int = 1, **kwargs: Any) -> Any:
        model = transformers.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        if lora:
            import peft

            model = peft.get_peft_model(model, peft.LoraConfig(
                r=8, target_modules="all-linear", lora_dropout=0.0))
            torch.manual_seed(1)
            for name, p in model.named_parameters():
                if "lora_B" in name:  # peft starts B at 0: a trained adapter's is not
                    torch.nn.init.normal_(p, std=0.1)
        args = trl.GRPOConfig(
            output_dir=None, per_device_train_batch_size=g * prompts, num_generations=g,
            max_completion_length=length, max_steps=steps, report_to=[], use_cpu=True,
            save_strategy="no", seed=0, disable_tqdm=True, logging_steps=10 ** 6)
        out = AdvcalGRPOTrainer(
            model=model, reward_funcs=reward, args=args, processing_class=tok,
            train_dataset=datasets.Dataset.from_dict({"prompt": texts * max(1, steps)}),
            **kwargs)
        out.model.train()
        out.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
        return out

    return make, {"advantage": "setgrpo", "calibration": calibration, "tau": 0.2}, texts


def _setgrpo_case(quick: bool) -> Case:
    import torch
    from trl.trainer.utils import shuffle_sequence_dict

    g = SETGRPO_SIZES[quick][0]
    trainer, setgrpo, texts = _trainers(quick)
    runs = {"grpo": trainer(advantage="grpo"),
            "setgrpo, every linear layer": trainer(**setgrpo),
            "setgrpo, last block": trainer(
                **setgrpo, gram_layers=[f"model.layers.{SETGRPO_WIDTH[quick][1] - 1}"])}
    if importlib.util.find_spec("peft") is not None:
        runs["grpo, LoRA"] = trainer(True, advantage="grpo")
        runs["setgrpo, LoRA"] = trainer(True, **setgrpo)
    with torch.no_grad():
        batch = runs["setgrpo, every linear layer"]._generate_and_score_completions(
            [{"prompt": text} for text in texts for _ in range(g)])
    # shuffled, as TRL's _prepare_inputs hands a generation batch to the loss
    torch.manual_seed(0)
    batch = shuffle_sequence_dict(batch)

    def loss(name: str, backward: bool) -> Any:
        run = runs[name]

        def step() -> Any:
            out = run.compute_loss(run.model, dict(batch))
            if backward:
                out.backward()
                run.model.zero_grad(set_to_none=True)
            return out

        return step

    candidates = {}
    for name in runs:
        candidates[f"{name}: loss forward"] = loss(name, False)
        candidates[f"{name}: forward + backward"] = loss(name, True)
    base = "grpo: forward + backward"
    prompts_in = [{"prompt": text} for text in texts for _ in range(g)]

    def generation() -> Any:
        # the rest of a TRL step: sampling the completions and scoring them (grpo's; the
        # setgrpo trainers run the same code there)
        with torch.no_grad():
            return runs["grpo"]._generate_and_score_completions(prompts_in)

    candidates[GENERATION] = generation

    def notes(rounds: Rounds) -> list[str]:
        # Every candidate shares every round (apart=inf), so each round gives one
        # backward (grpo forward + backward - grpo loss forward) and each setgrpo extra;
        # the ratio of their medians (a ratio of two differences per round is too noisy).
        times = {label: np.asarray(values) for label, values in rounds.times.items()}
        lines = []
        for name in runs:
            if name.startswith("grpo"):
                continue
            grpo = "grpo, LoRA" if name.endswith("LoRA") else "grpo"
            backward = np.median(times[f"{grpo}: forward + backward"]
                                 - times[f"{grpo}: loss forward"])
            step = np.median(times[f"{name}: forward + backward"]
                             - times[f"{grpo}: forward + backward"])
            forward = np.median(times[f"{name}: loss forward"] - times[f"{grpo}: loss forward"])
            whole = np.median(times[f"{name}: forward + backward"]
                              / times[f"{grpo}: forward + backward"])
            lines.append(f"{name}: step {whole:.2f}x {grpo}'s (paired median); extra per "
                         f"step {step / backward:.2f}x one backward pass of {grpo}; in the "
                         f"loss forward alone {forward / backward:.2f}x")
        gen = np.median(times[GENERATION])
        for name in runs:
            if not name.startswith("grpo"):
                grpo = "grpo, LoRA" if name.endswith("LoRA") else "grpo"
                ratio = (gen + np.median(times[f"{name}: forward + backward"])) / (
                    gen + np.median(times[f"{grpo}: forward + backward"]))
                lines.append(f"{name}: whole step (generation and scoring + loss forward + "
                             f"backward) {ratio:.2f}x {grpo}'s (medians)")
        return lines + [f"one backward pass = grpo forward + backward - grpo loss forward; "
                        f"each a median of {times[base].size} paired-round differences"]

    # Every candidate in every round, and several steps per round: one step is as short as
    # the scheduling noise of a shared machine.
    return Case("", candidates, baseline=base,
                notes=_Notes(notes, apart=math.inf, min_total=1.5))


def _train_report(quick: bool) -> list[str]:
    """Whole steps of ``trainer.train()`` (generation, scoring, loss, backward, clipping,
    optimizer, TRL's bookkeeping), GRPO and SetGRPO alternating in each round: a step's
    time is that of a run of ``long`` steps minus one of ``short`` (the fixed costs of a
    run cancel), over the steps between."""
    import contextlib
    import io
    import time

    import torch

    torch.set_num_threads(1)
    make, setgrpo, _ = _trainers(quick)
    short, long, rounds = (1, 3, 2) if quick else (2, 12, 5)
    modes = {"grpo": {"advantage": "grpo"}, "setgrpo, every linear layer": setgrpo}

    def seconds(steps: int, options: dict[str, Any]) -> float:
        trainer = make(steps=steps, **options)
        with contextlib.redirect_stdout(io.StringIO()):  # train() prints its metrics
            start = time.perf_counter()
            trainer.train()
            return time.perf_counter() - start

    for options in modes.values():
        seconds(short, options)  # the first run of each: kernels, caches
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, options in modes.items():
            times[mode].append((seconds(long, options) - seconds(short, options))
                               / (long - short))
    per_round = np.asarray(times["setgrpo, every linear layer"]) / np.asarray(times["grpo"])
    return [f"  {mode:<30} {np.median(t) * 1e3:8.1f} ms per step (median of {rounds} rounds, "
            f"each {long} - {short} steps)" for mode, t in times.items()] + [
        f"  setgrpo, every linear layer: {np.median(per_round):.2f}x grpo's step (paired "
        f"median; rounds {', '.join(f'{r:.2f}' for r in per_round)})"]


class _Notes(list[str]):
    """Notes computed from the rounds, after they ran (see ``_lazy``)."""

    def __init__(self, make: Callable[[Rounds], list[str]], **timing: Any) -> None:
        super().__init__()
        self.make = make
        # round_times options: apart=math.inf keeps every candidate in every round, as
        # notes that combine several candidates' times round by round need
        self.timing = timing


def _lazy(case: Case, build: Callable[[], Case | None]) -> Case:
    """``case`` (name and target) as a one-shot report that builds its candidates only when
    the runner selects it: building imports TRL and constructs trainers, which a run of
    other benchmarks (``--only``) should not pay for."""

    def report() -> list[str]:
        import torch

        from benchmarks.__main__ import table

        torch.set_num_threads(1)  # on a shared 2-core machine torch's pool measures contention
        built = build()
        if built is None:
            return ["TRL's advantage lines were not found in the installed TRL: not timed"]
        timing = built.notes.timing if isinstance(built.notes, _Notes) else {}
        rounds = round_times(built.candidates, **timing)
        lines = table(rounds, list(built.candidates), built.baseline)
        notes = built.notes
        return lines + (notes.make(rounds) if isinstance(notes, _Notes) else list(notes))

    case.report = report
    return case


def cases(quick: bool) -> list[Case]:
    if any(importlib.util.find_spec(name) is None for name in ("torch", "trl")):
        return []
    sizes = [(64, 0.0)] if quick else [(64, 0.0), (1024, 0.0), (1024, 0.05)]
    out = []
    for groups, none_fraction in sizes:
        label = f"{groups} groups x {G}" + (f", {none_fraction:.0%} None rewards"
                                             if none_fraction else "")
        out.append(_lazy(Case(f"TRL integration: advantage step, {label}", {}, "",
                              target=ADVANTAGE_TARGET),
                         functools.partial(_advantage_case, groups, none_fraction)))
    g, prompts, length = SETGRPO_SIZES[quick]
    hidden, layers = SETGRPO_WIDTH[quick]
    out.append(_lazy(Case(f"TRL integration: SetGRPO step on a Llama of hidden {hidden}, "
                          f"{layers} blocks, {prompts} groups of {g}, {length} completion "
                          "tokens, TRL's defaults (checkpointing on), one torch thread", {}, "",
                          target=SETGRPO_TARGET),
                     lambda: _setgrpo_case(quick)))
    out.append(Case(f"TRL integration: trainer.train() steps on a Llama of hidden {hidden}, "
                    f"{layers} blocks, {prompts} groups of {g}, {length} completion tokens, "
                    "TRL's defaults (checkpointing on), one torch thread", {}, "",
                    target=SETGRPO_TARGET, report=lambda: _train_report(quick)))
    return out
