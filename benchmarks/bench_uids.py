"""grpo in verl's layout: flat rewards grouped by per-response string ``uid`` labels.

verl labels each prompt with ``str(uuid.uuid4())`` in an object array and repeats it once
per response (``np.repeat``, so each group is contiguous); its batch balancing can reorder
the responses (the shuffled batches).  Target (issue 30): ``advcal.grpo(x,
group_ids=uids)`` within 3x ``advcal.grpo(x, offsets=offsets)`` (the same rewards
already grouped, CSR offsets) at 2**16 and 2**20 responses in groups of 8.  The other
rows show the parts and other label containers (a list of ``str``, a numpy ``U`` array).

verl's own ``compute_grpo_outcome_advantage`` (a Python loop over responses, torch
scalars; one torch thread) is far too slow to time in rounds: a case per size times it
once per batch (best of a few calls at 2**16) against the best of a few ``advcal.grpo``
calls, after checking that both compute the same advantages.  Skipped where verl or
torch is not installed.
"""

from __future__ import annotations

import time
import tracemalloc
import uuid
from collections.abc import Callable

import numpy as np

import advcal
from benchmarks import Case, check_close

GROUP = 8
EPS = 1e-6  # verl's epsilon and advcal.grpo's default eps


def verl_batch(n: int, shuffled: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Rewards and uids as verl makes them; the same rewards grouped, with CSR offsets."""
    rng = np.random.default_rng(seed)
    prompts = n // GROUP
    uids = np.repeat(np.array([str(uuid.uuid4()) for _ in range(prompts)], dtype=object),
                     GROUP)
    prompt_of = np.repeat(np.arange(prompts), GROUP)
    rewards = rng.random(n).astype(np.float32)
    if shuffled:
        perm = rng.permutation(n)
        uids, prompt_of, rewards = uids[perm], prompt_of[perm], rewards[perm]
    by_prompt = np.argsort(prompt_of, kind="stable")
    return {"x": rewards, "uids": uids, "by_prompt": by_prompt,
            "grouped": np.ascontiguousarray(rewards[by_prompt]),
            "offsets": np.arange(0, n + 1, GROUP, dtype=np.int64)}


def _check_layouts(batch: dict[str, np.ndarray]) -> str:
    ours = advcal.grpo(batch["x"], group_ids=batch["uids"])
    csr = advcal.grpo(batch["grouped"], offsets=batch["offsets"])
    np.testing.assert_array_equal(ours[batch["by_prompt"]], csr,
                                  err_msg="group_ids= and offsets= give other advantages")
    for ids in (batch["uids"].tolist(), batch["uids"].astype(str)):
        np.testing.assert_array_equal(advcal.grpo(batch["x"], group_ids=ids), ours)
    return ("checked before timing: advcal.grpo(x, group_ids=uids) equals "
            "advcal.grpo(grouped x, offsets=) exactly (and so do the list and U uids)")


def _peak_mb(fn: Callable[[], object]) -> float:
    """Peak memory numpy and Python allocate during ``fn()`` (tracemalloc), in MB."""
    fn()  # first: compilation, imports and caches are not the call's memory
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def _memory_notes(batch: dict[str, np.ndarray]) -> list[str]:
    x, uids = batch["x"], batch["uids"]
    rows = {
        "advcal.grpo(x, group_ids=uids)": lambda: advcal.grpo(x, group_ids=uids),
        "advcal.grpo(x, offsets=offsets)":
            lambda: advcal.grpo(batch["grouped"], offsets=batch["offsets"]),
        "advcal.groups_from_ids(uids)": lambda: advcal.groups_from_ids(uids),
    }
    return [f"peak traced memory, {label + ':':<34}{_peak_mb(fn):8.1f} MB"
            for label, fn in rows.items()] + [
        f"(the rewards: {x.nbytes / 1e6:.1f} MB; the uid array's pointers: "
        f"{uids.nbytes / 1e6:.1f} MB)"]


def _rounds_case(n: int, shuffled: bool) -> Case:
    layout = "shuffled" if shuffled else "contiguous"
    name = f"grpo with verl string uids, 2**{n.bit_length() - 1} responses, groups of 8, {layout}"
    case = Case(name, {}, baseline="advcal.grpo(x, offsets=offsets)",
                target="group_ids=uids within 3x offsets=")

    def build() -> Case:
        batch = verl_batch(n, shuffled)
        x, uids, grouped, offsets = (batch["x"], batch["uids"], batch["grouped"],
                                     batch["offsets"])
        as_list, as_unicode = uids.tolist(), uids.astype(str)
        return Case(
            name,
            {
                "advcal.grpo(x, group_ids=uids)": lambda: advcal.grpo(x, group_ids=uids),
                "advcal.grpo(x, offsets=offsets)": lambda: advcal.grpo(grouped, offsets=offsets),
                "advcal.groups_from_ids(uids) alone": lambda: advcal.groups_from_ids(uids),
                "grpo, group_ids=list of str": lambda: advcal.grpo(x, group_ids=as_list),
                "grpo, group_ids=numpy U array": lambda: advcal.grpo(x, group_ids=as_unicode),
            },
            baseline=case.baseline, target=case.target,
            notes=_memory_notes(batch),
            check=lambda: _check_layouts(batch),
        )

    case.build = build
    return case


def _verl_peer() -> Callable[..., object] | None:
    try:
        import torch
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    except ImportError:
        return None
    torch.set_num_threads(1)
    return compute_grpo_outcome_advantage


def _verl_case(n: int) -> Case:
    exp = n.bit_length() - 1
    name = f"grpo with verl string uids, 2**{exp} responses, groups of 8: vs verl's function"
    runs = 1 if n >= 1 << 18 else 3
    batches: dict[str, dict[str, np.ndarray]] = {}
    verl_times: dict[str, list[float]] = {}

    def call_verl(layout: str) -> np.ndarray:
        import torch

        peer = _verl_peer()
        assert peer is not None
        batch = batches[layout]
        scores = torch.from_numpy(batch["x"]).unsqueeze(-1)  # T = 1: one token per response
        mask = torch.ones_like(scores)
        start = time.perf_counter()
        advantages, _ = peer(scores.clone(), mask, batch["uids"], epsilon=EPS)
        verl_times.setdefault(layout, []).append(time.perf_counter() - start)
        return advantages[:, 0].numpy()

    def check() -> str:
        if _verl_peer() is None:
            return "verl or torch is not installed: no check"
        notes = []
        for layout in ("contiguous", "shuffled"):
            batches[layout] = verl_batch(n, layout == "shuffled", seed=1)
            batch = batches[layout]
            ours = advcal.grpo(batch["x"], group_ids=batch["uids"], eps=EPS)
            std = _group_std(batch)
            # verl sums n float32 rewards for the mean and std: differences of a few float32
            # roundings of the rewards, over the smallest std + eps.
            atol = (4 * GROUP * np.finfo(np.float32).eps * float(np.abs(batch["x"]).max())
                    * (1 + float(np.abs(ours).max())) / (float(std.min()) + EPS))
            notes.append(check_close(f"verl compute_grpo_outcome_advantage ({layout})",
                                     call_verl(layout), ours, atol=atol,
                                     why="float32 mean and std of 8 rewards, over the "
                                         "smallest std + eps"))
        return "; ".join(notes)

    def report() -> list[str]:
        if _verl_peer() is None:
            return ["verl or torch is not installed: verl's peer skipped"]
        lines = []
        for layout in ("contiguous", "shuffled"):
            if layout not in batches:
                batches[layout] = verl_batch(n, layout == "shuffled", seed=1)
            while len(verl_times.get(layout, [])) < runs:
                call_verl(layout)
            batch = batches[layout]
            ours = min(_timed(advcal.grpo, batch["x"], group_ids=batch["uids"])
                       for _ in range(5))
            theirs = min(verl_times[layout])
            lines.append(f"{layout:<11} verl compute_grpo_outcome_advantage {theirs:9.3f} s "
                         f"(best of {len(verl_times[layout])});  advcal.grpo(x, group_ids=uids) "
                         f"{ours * 1e3:8.2f} ms (best of 5):  advcal = {ours / theirs:.2e}x verl")
        return lines

    return Case(name, {}, baseline="", target="", report=report, check=check)


def _group_std(batch: dict[str, np.ndarray]) -> np.ndarray:
    """The std (ddof = 1) of each group of the grouped rewards, in float64."""
    return batch["grouped"].astype(np.float64).reshape(-1, GROUP).std(axis=1, ddof=1)


def _timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def cases(quick: bool) -> list[Case]:
    sizes = (1 << 12, 1 << 14) if quick else (1 << 16, 1 << 20)
    out = [_rounds_case(n, shuffled) for n in sizes for shuffled in (False, True)]
    return out + [_verl_case(n) for n in sizes]
