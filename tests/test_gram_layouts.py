"""GradientCapture on the layouts trainers use: packed batches (a token-to-response map),
flattened (N·T, d) rows, outputs edited in place, layers run on detached work (DoRA), and
groups split over micro-batches or data-parallel ranks (rows that add up).

The oracle is brute force, as in test_gram: one autograd pass per response over exactly
the covered parameters.  In float64 both sides compute the same products in other orders,
so 1e-10 of the largest entry holds with room (see test_gram.relative_error)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from advcal.torch import (  # noqa: E402
    GradientCapture,
    gather_rows,
    gram_from_rows,
    tokens_from_cu_seqlens,
    tokens_from_position_ids,
)
from tests.test_gram import (  # noqa: E402
    LlamaLogits,
    brute_force,
    layout_blocks,
    make_batch,
    make_model,
    objectives_of,
    one_thread,  # noqa: F401 (autouse: torch's pool on one thread)
)

nn = torch.nn
ROOT = Path(__file__).resolve().parents[1]


def blocks_of(full: np.ndarray, g: int) -> np.ndarray:
    return layout_blocks(full, {"group_size": g})


def close(gram: np.ndarray, expected: np.ndarray) -> None:
    assert gram.shape == expected.shape
    assert np.abs(gram - expected).max() <= 1e-10 * np.abs(expected).max()


# --------------------------------------------------------------------------- architectures


def no_dropout(**config: object) -> dict[str, object]:
    return {"vocab_size": 24, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, **config}


def tiny(kind: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "opt":  # its MLP runs on (N·T, d) rows
        config = transformers.OPTConfig(**no_dropout(
            ffn_dim=24, max_position_embeddings=32, word_embed_proj_dim=16, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0))
        model = transformers.OPTForCausalLM(config)
    elif kind == "falcon":  # parallel attention: a residual added in place into fc2's output
        config = transformers.FalconConfig(**no_dropout(
            parallel_attn=True, new_decoder_architecture=False, bias=True,
            attention_dropout=0.0, hidden_dropout=0.0))
        model = transformers.FalconForCausalLM(config)
    else:  # peft DoRA: its weight norm runs the adapters on detached work
        peft = pytest.importorskip("peft")
        config = transformers.LlamaConfig(**no_dropout(
            intermediate_size=24, num_key_value_heads=2, max_position_embeddings=32))
        base = transformers.LlamaForCausalLM(config)
        model = peft.get_peft_model(base, peft.LoraConfig(
            r=2, target_modules=["q_proj", "v_proj"], use_dora=True,
            init_lora_weights=False))
    model.config._attn_implementation = "eager"
    return LlamaLogits(model).double()


@pytest.mark.parametrize("sketch_dim", [None, 1 << 12])
@pytest.mark.parametrize("kind", ["opt", "falcon", "dora"])
def test_architectures_equal_brute_force(kind: str, sketch_dim: int | None) -> None:
    model = tiny(kind)
    batch = make_batch(6, vocab=24)
    layers = "lora" if kind == "dora" else None
    with GradientCapture(model, layers, sketch_dim=sketch_dim) as capture:
        objectives = objectives_of(model, batch)
    gram = capture.gram(objectives, group_size=3)
    close(gram, blocks_of(brute_force(model, batch, capture.parameters()), 3))
    if kind == "opt":
        assert any(name.endswith("layers.0.fc1") for name in capture.layers)


def test_an_output_edited_in_place_keeps_its_layers_gradient() -> None:
    from tests.test_gram import TokenMLP

    class InPlace(TokenMLP):
        def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                    ) -> torch.Tensor:
            h = self.fc1(self.embed(ids))
            h.mul_(2.0)
            h += self.embed(ids).sum(dim=-1, keepdim=True)
            return self.fc2(torch.tanh(h))

    torch.manual_seed(0)
    model = InPlace().double()
    batch = make_batch(6)
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    close(capture.gram(objectives, group_size=3),
          blocks_of(brute_force(model, batch, capture.parameters()), 3))


def test_an_edited_slice_of_a_layers_product_is_refused() -> None:
    # The layer returns every other column of its product, then the caller edits it in
    # place: δ arrives at the whole product, which is not the output's shape.
    class Strided(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x)[..., ::2]

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = Strided(3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            h.mul_(2.0)
            return h.sum(dim=(1, 2))

    model = Model().double()
    with GradientCapture(model) as capture:
        objectives = model(torch.randn(4, 5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="'fc'.*modified in place.*not the whole product"):
        capture.gram(objectives, group_size=2)


def test_flattened_rows_of_a_sequence_first_model_are_refused() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.reshape(-1, 3)).reshape(x.shape[0], x.shape[1])

    model = Flat().double()
    with GradientCapture(model, batch_dim=1) as capture:
        objectives = model(torch.randn(5, 4, 3, dtype=torch.float64)).sum(dim=0)
    with pytest.raises(ValueError, match="'fc'.*batch_dim=1"):
        capture.gram(objectives, group_size=2)


# --------------------------------------------------------------------------- packed batches


class SegmentModel(nn.Module):
    """Per-token layers around a causal running mean that stays inside each response: run
    padded (N, T) with a mask, or packed (1, L) with each token's response."""

    def __init__(self, vocab: int = 11, d: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.fc1 = nn.Linear(d, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: the lookups are covered too

    def forward(self, ids: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
        """``owner`` (same shape as ids): the response of each token, -1 for none."""
        h = torch.tanh(self.fc1(self.embed(ids)))
        flat = h.reshape(-1, h.shape[-1])
        who = owner.reshape(-1)
        same = (who[:, None] == who[None, :]) & (who[:, None] >= 0)
        causal = torch.ones(who.numel(), who.numel(), dtype=torch.bool).tril()
        weights = (same & causal).to(h.dtype)
        weights = weights / weights.sum(dim=1, keepdim=True).clamp(min=1)
        mixed = (weights @ flat).reshape(h.shape)
        return self.head(torch.tanh(self.mix(mixed)) + h)


def packed_batch(n: int, seed: int = 3) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 8, (n,), generator=gen).tolist()
    ids = torch.randint(0, 11, (sum(lengths),), generator=gen)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()])
    return ids, lengths, cu


def packed_objectives(model: SegmentModel, ids: torch.Tensor, lengths: list[int],
                      owner: torch.Tensor) -> torch.Tensor:
    """Per response, the log-probability of its tokens after its first, from one packed
    forward (1, L) with every response's tokens side by side, then padding."""
    logits = model(ids[None, :], owner[None, :])[0]
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
    same = (owner[1:] == owner[:-1]) & (owner[1:] >= 0)
    terms = torch.where(same, logp, torch.zeros_like(logp))
    sums = torch.zeros(len(lengths), dtype=logp.dtype).index_add(
        0, owner[1:].clamp(min=0), terms)
    return sums


@pytest.mark.parametrize("sketch_dim", [None, 4])
def test_a_packed_batch_equals_brute_force(sketch_dim: int | None) -> None:
    torch.manual_seed(0)
    model = SegmentModel().double()
    ids, lengths, cu = packed_batch(6)
    pad = 3  # tokens of no response after the last, as a fixed-length packing leaves
    ids = torch.cat([ids, torch.zeros(pad, dtype=ids.dtype)])
    tokens = tokens_from_cu_seqlens(cu, total=ids.numel())
    owner = torch.as_tensor(tokens)

    def run() -> torch.Tensor:
        return packed_objectives(model, ids, lengths, owner)

    with GradientCapture(model, sketch_dim=sketch_dim, seed=5) as capture:
        objectives = run()
    gram = capture.gram(objectives, group_size=3, tokens=tokens)
    params = capture.parameters()
    rows = []
    for i in range(len(lengths)):
        grads = torch.autograd.grad(run()[i], params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    features = torch.stack(rows)
    full = (features @ features.T).numpy()
    if sketch_dim is None:
        close(gram, blocks_of(full, 3))
    else:  # the sketch is the padded batch's sketch: same projections, zeros added
        padded_ids = torch.zeros(len(lengths), max(lengths), dtype=ids.dtype)
        padded_owner = torch.full_like(padded_ids, -1)
        for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
            padded_ids[i, :b - a] = ids[a:b]
            padded_owner[i, :b - a] = i
        packed_rows = rows_of(model, lambda: run(), tokens, sketch_dim)
        padded_rows = rows_of(model, lambda: padded_objectives(
            model, padded_ids, padded_owner), None, sketch_dim)
        assert torch.allclose(packed_rows, padded_rows, rtol=0, atol=1e-12 * float(
            padded_rows.abs().max()))
        assert np.allclose(gram, gram_from_rows(packed_rows, group_size=3), rtol=0,
                           atol=1e-12 * np.abs(gram).max())


def padded_objectives(model: SegmentModel, ids: torch.Tensor, owner: torch.Tensor
                      ) -> torch.Tensor:
    logits = model(ids, owner)
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    keep = owner[:, 1:] >= 0
    return torch.where(keep, logp, torch.zeros_like(logp)).sum(dim=1)


def rows_of(model: nn.Module, run: object, tokens: object, sketch_dim: int | None
            ) -> torch.Tensor:
    with GradientCapture(model, sketch_dim=sketch_dim, seed=5) as capture:
        objectives = run()  # type: ignore[operator]
    return capture.rows(objectives, tokens=tokens)


def test_token_maps_from_trainers_descriptions() -> None:
    assert tokens_from_cu_seqlens([0, 2, 2, 5]).tolist() == [0, 0, 2, 2, 2]
    assert tokens_from_cu_seqlens(np.array([0, 1]), total=3).tolist() == [0, -1, -1]
    assert tokens_from_position_ids(torch.tensor([[0, 1, 0, 0, 1, 2]])).tolist() == \
        [0, 0, 1, 2, 2, 2]
    for bad, match in (([1, 2], "start at 0"), ([0, 3, 2], "never decrease"),
                       ([0.0, 1.0], "integers")):
        with pytest.raises(ValueError, match=match):
            tokens_from_cu_seqlens(bad)
    with pytest.raises(ValueError, match="total"):
        tokens_from_cu_seqlens([0, 4], total=3)
    with pytest.raises(ValueError, match="position_ids"):
        tokens_from_position_ids([1, 0])


def test_a_token_map_that_does_not_fit_is_named() -> None:
    model = SegmentModel().double()
    ids, lengths, cu = packed_batch(4)
    owner = torch.as_tensor(tokens_from_cu_seqlens(cu))
    with GradientCapture(model) as capture:
        objectives = packed_objectives(model, ids, lengths, owner)
    with pytest.raises(ValueError, match="'fc1'.*tokens"):
        capture.gram(objectives, group_size=2, tokens=np.zeros(ids.numel() - 1, np.int64))
    with GradientCapture(model) as capture:
        objectives = packed_objectives(model, ids, lengths, owner)
    with pytest.raises(ValueError, match=r"tokens.*\[0, 4\)"):
        capture.gram(objectives, group_size=2, tokens=np.full(ids.numel(), 4))
    with GradientCapture(model) as capture:
        objectives = packed_objectives(model, ids, lengths, owner)
    with pytest.raises(ValueError, match="`tokens` must map at least one token"):
        capture.gram(objectives, group_size=2, tokens=np.zeros(0, np.int64))


# --------------------------------------------------------------------------- split groups


def sum_logps(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    ids, attention, completion = batch
    logits = model(ids, attention_mask=attention)
    logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return (logps * completion).sum(dim=1)


@pytest.mark.parametrize("sketch_dim", [None, 8])
@pytest.mark.parametrize("kind", ["mlp", "llama"])
def test_micro_batches_give_the_whole_batchs_gram(kind: str, sketch_dim: int | None) -> None:
    # groups of 3 split 2 + 1 over micro-batches: rows of each pass, side by side
    if kind == "llama":
        pytest.importorskip("transformers")
    model = make_model(kind)
    ids, attention, completion = make_batch(6, vocab=24 if kind == "llama" else 11)
    with GradientCapture(model, sketch_dim=sketch_dim, seed=7) as capture:
        whole = capture.gram(sum_logps(model, (ids, attention, completion)), group_size=3)
    parts = []
    for rows in ([0, 1, 3, 4], [2, 5]):
        sub = tuple(t[rows] for t in (ids, attention, completion))
        with GradientCapture(model, sketch_dim=sketch_dim, seed=7) as capture:
            objectives = sum_logps(model, sub)
        parts.append((rows, capture.rows(objectives)))
    order = np.concatenate([rows for rows, _ in parts])
    stacked = torch.cat([r for _, r in parts])
    gathered = torch.empty_like(stacked)
    gathered[torch.as_tensor(order)] = stacked
    split = gram_from_rows(gathered, group_size=3)
    close(split, whole)
    if sketch_dim is None:
        params = capture.parameters()
        features = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
            j, params, retain_graph=True)]) for j in sum_logps(model, (ids, attention,
                                                                    completion))])
        close(split, blocks_of((features @ features.T).numpy(), 3))


def test_rows_refuse_a_layer_that_did_not_run_and_bad_rows() -> None:
    model = make_model("mlp")
    batch = make_batch(4)
    with GradientCapture(model) as capture:
        objectives = objectives_of(model, batch)
    assert capture.rows(objectives).shape[0] == 4

    class Skips(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(2, 1)
            self.unused = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)[:, 0]

    skips = Skips().double()
    with GradientCapture(skips) as capture:
        objectives = skips(torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="'unused'.*did not run"):
        capture.rows(objectives)
    with pytest.raises(TypeError, match="rows"):
        gram_from_rows(np.ones((2, 2)), group_size=2)
    with pytest.raises(ValueError, match="NaN"):
        gram_from_rows(torch.tensor([[1.0], [float("nan")]]), group_size=2)
    with pytest.raises(ValueError, match="exactly one"):
        gram_from_rows(torch.ones(2, 2))
    with pytest.raises(ValueError, match="non-empty 2-D floating"):
        gram_from_rows(torch.ones(4, dtype=torch.int64), group_size=2)
    with pytest.raises(ValueError, match="`output` must be"):
        gram_from_rows(torch.ones(2, 2), group_size=2, output="list")


def test_gather_rows_needs_a_process_group_and_a_tensor() -> None:
    with pytest.raises(TypeError, match="`rows` must be a torch.Tensor"):
        gather_rows(np.ones((2, 3)))
    with pytest.raises(ValueError, match="`rows` must be a 2-D tensor"):
        gather_rows(torch.ones(3))
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="initialised torch.distributed process group"):
        gather_rows(torch.ones(2, 3))


RANKS = textwrap.dedent("""
    import os, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.environ["ADVCAL_ROOT"])
    from advcal.torch import GradientCapture, gather_rows, gram_from_rows
    from tests.test_gram import make_batch, make_model
    from tests.test_gram_layouts import sum_logps

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    sketch_dim = None if sys.argv[1] == "exact" else int(sys.argv[1])
    model = make_model("mlp")
    batch = make_batch(8)
    # two groups of 4, each split 2 + 2 over the ranks (TRL's layout when
    # per_device_train_batch_size < num_generations)
    mine = [0, 1, 4, 5] if rank == 0 else [2, 3, 6, 7]
    sub = tuple(t[mine] for t in batch)
    with GradientCapture(model, sketch_dim=sketch_dim, seed=3) as capture:
        objectives = sum_logps(model, sub)
    rows = gather_rows(capture.rows(objectives))
    order = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])
    whole_rows = torch.empty_like(rows)
    whole_rows[order] = rows
    split = gram_from_rows(whole_rows, group_size=4)
    with GradientCapture(model, sketch_dim=sketch_dim, seed=3) as capture:
        unsplit = capture.gram(sum_logps(model, batch), group_size=4)
    np.save(os.path.join(os.environ["ADVCAL_OUT"], f"rank{rank}.npy"),
            np.stack([split, unsplit]))
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("sketch_dim", ["exact", "16"])
def test_a_group_split_over_two_ranks(tmp_path: Path, sketch_dim: str) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    env = {**os.environ, "ADVCAL_ROOT": str(ROOT), "ADVCAL_OUT": str(tmp_path),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", "0", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0",
         str(script), sketch_dim],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        split, unsplit = np.load(tmp_path / f"rank{rank}.npy")
        close(split, unsplit)
