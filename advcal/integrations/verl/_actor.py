"""verl's actor side of SetGRPO: the worker-side Gram pass (a grad-enabled forward under
:class:`advcal.torch.GradientCapture`, whole groups per forward), the worker method that
runs it, and the trainer hook that calls it between the old-log-prob pass and
``compute_advantage``."""

from __future__ import annotations

from typing import Any

import numpy as np

import advcal
from advcal.integrations.verl._config import GRAM_FIELDS, GRAM_KEY, LOSS_AGG_MODES, _options
from advcal.integrations.verl._estimators import gram_rows, patch_compute_advantage


def policy_objectives(log_probs: Any, response_mask: Any, loss_agg_mode: str = "token-mean", *,
                      dp_size: int = 1, batch_num_tokens: Any = None,
                      global_batch_size: Any = None, loss_scale_factor: Any = None) -> Any:
    """Per-response objectives J_i, normalised as verl's policy loss normalises them.

    verl's policy loss is ``agg_loss(-A * ratio, response_mask, loss_agg_mode, ...)``.  At
    the current policy (ratio 1, no clipping active) its gradient is −Σ_i A_i ∇J_i with
    these J_i, so SetGRPO's coefficients multiply exactly the gradients whose Gram matrix
    :class:`advcal.torch.GradientCapture` computes from them.

    Parameters
    ----------
    log_probs : torch.Tensor, shape (N, R)
        Log-probabilities of the response tokens under the policy (with gradients).
    response_mask : torch.Tensor, shape (N, R)
        1 for response tokens in the loss, 0 for padding.
    loss_agg_mode : str, default "token-mean"
        verl's ``actor.loss_agg_mode`` (one of :data:`LOSS_AGG_MODES`): ``"token-mean"``
        J_i = Σ_t m·logp / ``batch_num_tokens`` · ``dp_size``; ``"token-sum"`` Σ_t m·logp ·
        ``dp_size``; ``"seq-mean-token-sum"`` Σ_t m·logp / ``global_batch_size`` ·
        ``dp_size``; ``"seq-mean-token-sum-norm"`` the same over ``loss_scale_factor``
        (default R); ``"seq-mean-token-mean"`` the response's token mean over
        ``global_batch_size`` · ``dp_size``.  A response without tokens has J_i = 0.
    dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
        As verl's ``agg_loss`` takes them; ``batch_num_tokens`` defaults to the mask's sum
        and ``global_batch_size`` to the responses with tokens, as ``agg_loss`` does for one
        rank.  They scale every J_i alike.

    Returns
    -------
    torch.Tensor, shape (N,)
        J_i, differentiable; float32 for half-precision log-probabilities.

    Examples
    --------
    >>> import torch
    >>> from advcal.integrations.verl import policy_objectives
    >>> logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    >>> mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> policy_objectives(logp, mask)                       # token sums / 5 tokens
    tensor([-1.2000, -0.2000])
    >>> policy_objectives(logp, mask, "seq-mean-token-mean")  # token means / 2 responses
    tensor([-1.0000, -0.2500])
    """
    import torch

    if not torch.is_tensor(log_probs) or not log_probs.is_floating_point() \
            or log_probs.ndim != 2:
        raise TypeError("`log_probs` must be a 2-D floating torch.Tensor (responses, tokens).")
    if not torch.is_tensor(response_mask) or response_mask.shape != log_probs.shape:
        raise ValueError(f"`response_mask` must be a torch.Tensor of shape "
                         f"{tuple(log_probs.shape)}; got "
                         f"{getattr(response_mask, 'shape', type(response_mask).__name__)}.")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"`loss_agg_mode` must be one of {LOSS_AGG_MODES} (verl's "
                         f"actor.loss_agg_mode); got {loss_agg_mode!r}.")
    if isinstance(dp_size, bool) or not isinstance(dp_size, (int, np.integer)) or dp_size < 1:
        raise ValueError(f"`dp_size` must be a positive integer; got {dp_size!r}.")
    logp = log_probs.float() if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs
    mask = response_mask.to(device=logp.device, dtype=logp.dtype)
    sums = (logp * mask).sum(dim=1)
    if loss_agg_mode == "token-sum":
        return sums * dp_size
    if loss_agg_mode == "token-mean":
        tokens = _positive(batch_num_tokens, mask.sum(), "batch_num_tokens", logp)
        return sums / tokens * dp_size
    counts = mask.sum(dim=1)
    seq_mask = (counts > 0).to(logp.dtype)
    size = _positive(global_batch_size, seq_mask.sum(), "global_batch_size", logp)
    if loss_agg_mode == "seq-mean-token-mean":
        # agg_loss divides by count + 1e-8; verl's ppo_loss hands it a bool mask, whose
        # integer count plus 1e-8 is float32, where the 1e-8 is lost: the count itself
        return sums / counts.clamp(min=1.0) * seq_mask / size * dp_size
    out = sums * seq_mask / size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        out = out / _positive(loss_scale_factor, float(mask.shape[1]), "loss_scale_factor", logp)
    return out


def _positive(value: Any, default: Any, name: str, like: Any) -> Any:
    import torch

    tensor = torch.as_tensor(default if value is None else value, dtype=like.dtype,
                             device=like.device)
    if tensor.ndim != 0 or not bool(torch.isfinite(tensor)) or not bool(tensor > 0):
        if value is None:  # an empty batch: nothing to normalise, J is 0
            return torch.ones((), dtype=like.dtype, device=like.device)
        raise ValueError(f"`{name}` must be a positive finite scalar; got {value!r}.")
    return tensor


def _unwrapped(module: Any) -> Any:
    # FSDP1 and DDP wrap the model in `.module`; FSDP2 keeps the model's own class
    inner = getattr(module, "module", None)
    return inner if inner is not None and hasattr(inner, "forward") else module


def response_log_probs(module: Any, input_ids: Any, attention_mask: Any, position_ids: Any,
                       responses: Any, *, temperature: float = 1.0) -> Any:
    """Log-probabilities of the response tokens of verl's padded batch, with gradients.

    verl's rollout batch holds each sequence as its prompt, left-padded, then its response,
    right-padded: ``input_ids`` (N, P + R), ``responses`` its last R columns.  The model
    runs on the attended tokens of each row moved to the left (right padding only, the
    layout of verl's actor with ``use_remove_padding=False``), with their ``position_ids``,
    so that no query row is fully masked; the logits are divided by ``temperature`` as
    verl's actor divides them.

    Parameters
    ----------
    module : torch.nn.Module
        A causal LM returning ``.logits`` (the actor; FSDP-wrapped or not).
    input_ids, attention_mask, position_ids : torch.Tensor, shape (N, P + R)
        ``position_ids`` may also be (N, C, P + R) (multi-axis positions).
    responses : torch.Tensor, shape (N, R)
    temperature : float, default 1.0
        verl's ``rollout.temperature``.

    Returns
    -------
    torch.Tensor, shape (N, R)
        log π(response token | prefix), float32 or wider; 0 past a response's end.
    """
    import inspect

    import torch

    if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
            and np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"`temperature` must be a positive number; got {temperature!r}.")
    n, r = int(responses.shape[0]), int(responses.shape[1])
    if input_ids.ndim != 2 or input_ids.shape[0] != n or input_ids.shape[1] <= r:
        raise ValueError(f"`input_ids` must be (N, prompt + response) with a prompt before the "
                         f"{r} response columns; got shape {tuple(input_ids.shape)}.")
    attended = attention_mask.to(torch.bool)
    prompt = attended[:, :-r].sum(dim=1)
    answer = attended[:, -r:].sum(dim=1)
    if bool((prompt < 1).any()):
        raise ValueError("every row needs at least one attended prompt token (it scores the "
                         "response's first token).")
    # attended tokens first, in order (a stable sort of the padding flags)
    order = torch.argsort((~attended).to(torch.int8), dim=1, stable=True)
    width = int((prompt + answer).max())
    order = order[:, :width]
    ids = input_ids.gather(1, order)
    mask = attended.gather(1, order).to(attention_mask.dtype)
    if position_ids.ndim == 3:
        positions = position_ids.gather(2, order[:, None, :].expand(-1, position_ids.shape[1], -1))
    else:
        positions = position_ids.gather(1, order)
    keep_mask = mask.bool() if positions.ndim == 2 else mask.bool()[:, None, :]
    positions = torch.where(keep_mask, positions, torch.zeros_like(positions))
    # the logits that score response token j of row i sit at prompt_i - 1 + j
    first = int(prompt.min()) - 1
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask,
                              "position_ids": positions, "use_cache": False}
    keep = width - first
    try:
        if "logits_to_keep" in inspect.signature(_unwrapped(module).forward).parameters:
            kwargs["logits_to_keep"] = keep  # the head runs on the positions that score
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        pass
    logits = module(**kwargs).logits
    logits = logits[:, logits.shape[1] - keep:]
    at = (prompt - 1 - first)[:, None] + torch.arange(r, device=prompt.device)[None, :]
    at = at.clamp(max=keep - 1).to(logits.device)
    logits = logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    logp = logp.gather(-1, responses.to(logp.device).long().unsqueeze(-1)).squeeze(-1)
    inside = torch.arange(r, device=logp.device)[None, :] < answer.to(logp.device)[:, None]
    return torch.where(inside, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))


def _field(data: Any, key: str) -> Any:
    batch = getattr(data, "batch", data)
    try:
        return batch[key]
    except KeyError:
        raise ValueError(f"`data` has no batch[{key!r}]: the Gram pass reads "
                         f"{', '.join(GRAM_FIELDS)} (verl's padded rollout layout) and "
                         "non_tensor_batch['uid'].") from None


def _group_chunks(index: Any, cost: np.ndarray, max_token_len: int | None,
                 forwards: int | None = None) -> list[list[np.ndarray]]:
    """Whole groups per forward, in group order: a chunk grows while its padded size
    (rows × longest row) stays within ``max_token_len``; a group larger than that is a
    chunk of its own (a group's Gram needs all its members in one forward).  With
    ``forwards``, chunks of several groups are halved until there are that many, if the
    groups allow."""
    chunks: list[list[np.ndarray]] = []
    members: list[np.ndarray] = []
    rows, longest = 0, 0
    for q in range(index.offsets.size - 1):
        group = index.order[index.offsets[q]:index.offsets[q + 1]]
        g_longest = int(cost[group].max(initial=0))
        grown = (rows + group.size) * max(longest, g_longest)
        if members and max_token_len is not None and grown > max_token_len:
            chunks.append(members)
            members, rows, longest = [], 0, 0
        members.append(group)
        rows += group.size
        longest = max(longest, g_longest)
    if members:
        chunks.append(members)
    while forwards is not None and len(chunks) < forwards:
        widest = max(range(len(chunks)), key=lambda c: len(chunks[c]))
        if len(chunks[widest]) < 2:
            break
        half = len(chunks[widest]) // 2
        chunks[widest:widest + 1] = [chunks[widest][:half], chunks[widest][half:]]
    return chunks


def gram_forwards(data: Any, max_token_len: int | None = None) -> int:
    """How many forwards :func:`compute_gram_rows` runs on ``data`` with this budget.

    Under FSDP every rank of the data-parallel group must run as many forwards (each one
    gathers the sharded weights collectively): the worker method takes the largest count
    over the ranks and passes it as ``compute_gram_rows(..., forwards=...)``.
    """
    uids = np.asarray(data.non_tensor_batch["uid"], dtype=object)
    lengths = _field(data, "attention_mask").detach().to(dtype=bool).sum(dim=1).cpu().numpy()
    return len(_group_chunks(advcal.groups_from_ids(uids), lengths, max_token_len))


def _rows(tensor: Any, rows: Any, device: Any) -> Any:
    """The chunk's rows of a batch tensor, on the model's device."""
    return tensor.index_select(0, rows.to(tensor.device)).to(device)


def compute_gram_rows(module: Any, data: Any, *, layers: Any = None,
                      sketch_dim: int | None = None, seed: int = 0, sketch: str = "gaussian",
                      loss_agg_mode: str = "token-mean", temperature: float = 1.0,
                      max_token_len: int | None = None, dp_size: int = 1,
                      batch_num_tokens: Any = None, global_batch_size: Any = None,
                      loss_scale_factor: Any = None, width: int | None = None,
                      forwards: int | None = None) -> np.ndarray:
    """The worker-side Gram pass: each response's Gram row under the actor's current policy.

    Runs the actor on ``data`` in verl's padded layout with gradients enabled, under
    :class:`advcal.torch.GradientCapture`, one forward per chunk of whole ``uid`` groups
    (whatever the batch's order: ``balance_batch`` permutes rows and their uids with
    them), computes J_i with :func:`policy_objectives` and returns the Gram rows
    :func:`attach_gram` stores.  Nothing is written into ``.grad``; the graph of each chunk
    is freed before the next.

    Parameters
    ----------
    module : torch.nn.Module
        The actor (a transformers causal LM; FSDP-wrapped or not).
    data : verl.DataProto
        ``batch`` with ``input_ids``, ``attention_mask``, ``position_ids`` (N, P + R),
        ``responses`` and ``response_mask`` (N, R); ``non_tensor_batch["uid"]``.
    layers, sketch_dim, seed, sketch
        :class:`~advcal.torch.GradientCapture`'s: which layers K covers (None: every
        linear layer), exact K or a sketch of that size, the projections' seed and kind.
        The same seed gives the same projections in every chunk and on every rank.
    loss_agg_mode : str, default "token-mean"
        verl's ``actor.loss_agg_mode`` (see :func:`policy_objectives`).
    temperature : float, default 1.0
        verl's ``rollout.temperature`` (the actor divides its logits by it).
    max_token_len : int, optional
        Token budget of one forward (rows × longest row of a chunk, padding included).
        Chunks hold whole groups; a group over the budget runs alone.  None: one forward.
    dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
        :func:`policy_objectives`'s constants, computed once for the whole ``data`` when
        not given (so chunks share them); the trainer hook passes the whole step's.
    width : int, optional
        Columns of the result (at least the largest group); default the largest group.
    forwards : int, optional
        Run exactly this many forwards (at least :func:`gram_forwards`): chunks of several
        groups are split further, and where the groups run out the last chunk runs again,
        its result unused.  Under FSDP every rank must run as many.

    Returns
    -------
    ndarray of float64, shape (N, width)
        Row i holds ⟨g_i, g_j⟩ for the members j of i's group in batch order, NaN-padded
        (the layout of :func:`gram_rows`).
    """
    import torch

    from advcal.torch import GradientCapture

    non_tensor = getattr(data, "non_tensor_batch", None)
    if not isinstance(non_tensor, dict) or "uid" not in non_tensor:
        raise ValueError("`data` has no non_tensor_batch['uid']: the groups of the Gram rows.")
    if max_token_len is not None and (isinstance(max_token_len, bool)
                                      or not isinstance(max_token_len, (int, np.integer))
                                      or max_token_len < 1):
        raise ValueError(f"`max_token_len` must be None or a positive integer; got "
                         f"{max_token_len!r}.")
    input_ids, attention_mask, position_ids, responses, response_mask = (
        _field(data, key) for key in GRAM_FIELDS)
    uids = np.asarray(non_tensor["uid"], dtype=object)
    n = int(input_ids.shape[0])
    if uids.shape != (n,):
        raise ValueError(f"non_tensor_batch['uid'] must hold one uid per row ({n}); got shape "
                         f"{uids.shape}.")
    r = int(responses.shape[1])
    index = advcal.groups_from_ids(uids)
    sizes = np.diff(index.offsets)
    largest = int(sizes.max(initial=0))
    width = largest if width is None else int(width)
    if width < largest:
        raise ValueError(f"`width` must be at least the largest group ({largest}); got {width}.")
    out = np.full((n, width), np.nan)
    if n == 0:
        return out
    # the whole batch's constants, so that splitting it into chunks changes nothing
    mask = response_mask.detach()
    if batch_num_tokens is None:
        batch_num_tokens = float(mask.sum())
    if global_batch_size is None:
        global_batch_size = float((mask.sum(dim=1) > 0).sum())
    if loss_scale_factor is None and loss_agg_mode == "seq-mean-token-sum-norm":
        loss_scale_factor = float(r)
    attention = attention_mask.detach().to(torch.bool)
    lengths = attention.sum(dim=1).cpu().numpy()
    device = next((p.device for p in module.parameters()), input_ids.device)
    if forwards is not None and (isinstance(forwards, bool)
                                 or not isinstance(forwards, (int, np.integer)) or forwards < 1):
        raise ValueError(f"`forwards` must be None or a positive integer; got {forwards!r}.")
    plan = [np.sort(np.concatenate(groups))
            for groups in _group_chunks(index, lengths, max_token_len, forwards)]
    if forwards is not None and forwards < len(plan):
        raise ValueError(f"`forwards` ({forwards}) is below the {len(plan)} forwards this "
                         "batch needs under this budget (see gram_forwards).")
    spare = 0 if forwards is None else forwards - len(plan)
    for step, rows in enumerate(plan + [plan[-1]] * spare):
        picked = torch.as_tensor(rows, device=input_ids.device)
        with GradientCapture(module, layers, sketch_dim=sketch_dim, seed=seed,
                             sketch=sketch) as capture:
            logp = response_log_probs(
                module, *(_rows(data_field, picked, device) for data_field in
                          (input_ids, attention_mask, position_ids, responses)),
                temperature=temperature)
            objectives = policy_objectives(
                logp, _rows(response_mask, picked, device), loss_agg_mode,
                dp_size=dp_size,
                batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                loss_scale_factor=loss_scale_factor)
        blocks = capture.gram(objectives, group_ids=uids[rows])
        del objectives, logp, capture
        if step < len(plan):  # past it: a rank's spare forward, in step with the others
            chunk_rows = gram_rows(blocks, uids[rows])
            out[rows, :chunk_rows.shape[1]] = chunk_rows
    return out



def _gram_settings(options: dict[str, Any], actor_config: Any, meta: dict[str, Any]
                   ) -> dict[str, Any]:
    """compute_gram_rows' keywords from the "setgrpo" options, the actor's config and the
    batch's meta_info (which the trainer hook fills)."""
    def config(key: str, default: Any) -> Any:
        value = actor_config.get(key, default) if hasattr(actor_config, "get") else \
            getattr(actor_config, key, default)
        return default if value is None else value

    budget = options.get("gram_max_token_len")
    if budget is None and config("use_dynamic_bsz", False):
        budget = config("ppo_max_token_len_per_gpu", None)
    elif budget is None and config("ppo_micro_batch_size_per_gpu", None):
        # as many rows as the actor's micro-batch, at the batch's longest row
        budget = int(config("ppo_micro_batch_size_per_gpu", 1)) * int(meta.get("advcal_longest", 1))
    return {
        "layers": options.get("gram_layers"),
        "sketch_dim": options.get("gram_sketch_dim"),
        "seed": options.get("gram_seed", 0),
        "sketch": options.get("gram_sketch", "gaussian"),
        "loss_agg_mode": options.get("loss_agg_mode", config("loss_agg_mode", "token-mean")),
        "loss_scale_factor": options.get("loss_scale_factor", config("loss_scale_factor", None)),
        "max_token_len": budget,
        "temperature": float(meta.get("temperature", 1.0)),
        "batch_num_tokens": meta.get("advcal_batch_num_tokens"),
        "global_batch_size": meta.get("advcal_global_batch_size"),
        "width": meta.get("advcal_gram_width"),
    }


def _actor_of(worker: Any) -> tuple[Any, Any, Any]:
    """(module, context, actor config) of a verl actor worker: the model engine's worker
    (verl 0.9: ``worker.actor.engine``), the legacy FSDP worker (``actor_module_fsdp``),
    or a worker that sets ``advcal_module``."""
    from contextlib import nullcontext

    config: Any = getattr(worker, "config", None)
    actor_config = config.get("actor", {}) if hasattr(config, "get") else {}
    module = getattr(worker, "advcal_module", None)
    if module is not None:
        return module, nullcontext(), actor_config
    engine = getattr(getattr(worker, "actor", None), "engine", None)
    if engine is not None and getattr(engine, "module", None) is not None:
        sp = int(getattr(engine, "ulysses_sequence_parallel_size", 1) or 1)
        if sp > 1:
            raise ValueError("the advcal Gram pass runs the actor on whole padded sequences; "
                             "it does not run under Ulysses sequence parallelism "
                             f"(actor ulysses_sequence_parallel_size={sp}): set it to 1.")
        return engine.module, engine.eval_mode(), actor_config
    module = getattr(worker, "actor_module_fsdp", None)
    if module is not None:
        return module, nullcontext(), actor_config
    raise ValueError("this worker has no actor model the Gram pass recognises (verl's "
                     "ActorRolloutRefWorker: worker.actor.engine.module); set "
                     "`advcal_module` on the worker to the actor's torch module.")


def _data_parallel_group(worker: Any) -> Any:
    """The actor's data-parallel process group when it has more than one rank, else None."""
    import torch

    engine = getattr(getattr(worker, "actor", None), "engine", None)
    if engine is None or not torch.distributed.is_initialized():
        return None
    group = engine.get_data_parallel_group()
    return group if group is not None and torch.distributed.get_world_size(group) > 1 else None


def _dispatch_mode() -> Any:
    from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn

    return make_nd_compute_dataproto_dispatch_fn(mesh_name="actor")


def _gram_method(self: Any, data: Any) -> Any:
    """Worker method ``compute_advcal_gram``: this rank's Gram rows of ``data``."""
    import torch
    from verl import DataProto

    module, context, actor_config = _actor_of(self)
    settings = _gram_settings(_options("setgrpo"), actor_config, dict(data.meta_info))
    group = _data_parallel_group(self)
    if group is not None:
        count = torch.tensor([gram_forwards(data, settings["max_token_len"])],
                             device=next((p.device for p in module.parameters()), "cpu"))
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=group)
        settings["forwards"] = int(count.item())
    with context:
        rows = compute_gram_rows(module, data, **settings)
    return DataProto.from_dict(tensors={GRAM_KEY: torch.as_tensor(rows)})


def _make_mixin() -> type:
    from verl.single_controller.base.decorator import register

    class GramWorkerMixin:
        """Adds ``compute_advcal_gram(data) -> DataProto`` to a verl actor worker: the
        worker-side Gram pass (:func:`compute_gram_rows`) on the actor's model, dispatched
        over the actor's data-parallel ranks like verl's ``compute_log_prob``.  Its
        options are the ``"setgrpo"`` options (:func:`configure` or
        ``ADVCAL_VERL_OPTIONS``); ``loss_agg_mode``, ``loss_scale_factor`` and, with
        ``use_dynamic_bsz``, the token budget default to the actor's config."""

        @register(dispatch_mode=_dispatch_mode())
        def compute_advcal_gram(self, data: Any) -> Any:
            return _gram_method(self, data)

    # pickled by reference into Ray's workers, where this module defines it as well
    GramWorkerMixin.__module__ = "advcal.integrations.verl"
    GramWorkerMixin.__qualname__ = "GramWorkerMixin"
    return GramWorkerMixin


GramWorkerMixin: type = _make_mixin()
_worker_classes: dict[type, type] = {}


def gram_worker_class(base: type | None = None) -> type:
    """A verl actor worker class with :class:`GramWorkerMixin`'s method.

    Parameters
    ----------
    base : type, optional
        The worker class; default verl's ``ActorRolloutRefWorker``
        (``verl.workers.engine_workers``).  A class that has the method already is
        returned as it is.

    Returns
    -------
    type
        ``class Advcal<base>(GramWorkerMixin, base)``, the same class for the same base.
    """
    if base is None:
        from verl.workers.engine_workers import ActorRolloutRefWorker

        base = ActorRolloutRefWorker
    if not isinstance(base, type):
        raise TypeError(f"`base` must be a class; got {type(base).__name__}.")
    if issubclass(base, GramWorkerMixin):
        return base
    if base not in _worker_classes:
        cls = type(f"Advcal{base.__name__}", (GramWorkerMixin, base), {"__module__": __name__})
        cls.__qualname__ = cls.__name__
        _worker_classes[base] = cls
    return _worker_classes[base]


def _whole_group_order(uids: np.ndarray, dp_size: int) -> np.ndarray:
    """A permutation giving each of ``dp_size`` equal contiguous slices whole groups, as
    balanced in rows as the groups allow; a ValueError when no such split exists."""
    index = advcal.groups_from_ids(uids)
    n = index.order.size
    sizes = np.diff(index.offsets)
    if dp_size == 1:
        return index.order.copy()
    if n % dp_size:
        raise ValueError(f"the Gram pass needs the batch's {n} responses in {dp_size} equal "
                         "shares of whole uid groups (the actor's data-parallel size); "
                         f"{n} is not a multiple of {dp_size}.")
    share = n // dp_size
    bins: list[list[int]] = [[] for _ in range(dp_size)]
    load = np.zeros(dp_size, dtype=np.int64)
    for q in np.argsort(-sizes, kind="stable"):  # largest first, into the emptiest share
        fits = np.flatnonzero(load + sizes[q] <= share)
        if fits.size == 0:
            raise ValueError(
                f"the Gram pass needs whole uid groups on each data-parallel rank, and these "
                f"groups (sizes {sorted(set(sizes.tolist()))}) do not split into {dp_size} "
                f"shares of {share} responses: make the number of prompts per step "
                "(data.train_batch_size) a multiple of the actor's data-parallel size "
                "(trainer.n_gpus_per_node × trainer.nnodes / sequence-parallel size).")
        b = fits[np.argmin(load[fits])]
        bins[b].append(int(q))
        load[b] += sizes[q]
    return np.concatenate([index.order[index.offsets[q]:index.offsets[q + 1]]
                           for b in bins for q in sorted(b)])


def gram_from_workers(worker_group: Any, data: Any, *, dp_size: int | None = None,
                      temperature: float = 1.0) -> Any:
    """Run ``compute_advcal_gram`` on the actor workers; the rows in ``data``'s order.

    Whole groups go to one data-parallel rank: the rows are regrouped before dispatch
    (each rank gets an equal share of whole groups) and put back in ``data``'s order
    after, so ``balance_batch``'s reordering and groups split across ranks change nothing.

    Parameters
    ----------
    worker_group : verl RayWorkerGroup
        The actor's worker group (its workers built from :func:`gram_worker_class`).
    data : verl.DataProto
        The step's batch (the fields of :func:`compute_gram_rows` and ``uid``).
    dp_size : int, optional
        The actor's data-parallel size; default from the group's dispatch info.
    temperature : float, default 1.0
        verl's ``rollout.temperature``.

    Returns
    -------
    torch.Tensor of float64, shape (N, largest group)
        The rows, as :func:`attach_gram` stores them.
    """
    import torch

    if "uid" not in data.non_tensor_batch:
        raise ValueError("`data` has no non_tensor_batch['uid']: the groups of the Gram rows.")
    if not hasattr(worker_group, "compute_advcal_gram"):
        raise ValueError("the actor's workers have no compute_advcal_gram method: build them "
                         "from advcal.integrations.verl.gram_worker_class() (install() does "
                         "this in RayPPOTrainer.init_workers).")
    if dp_size is None:
        if "actor" not in worker_group._dispatch_info:
            worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
        dp_size = max(worker_group._dispatch_info["actor"]) + 1
    uids = np.asarray(data.non_tensor_batch["uid"], dtype=object)
    order = _whole_group_order(uids, int(dp_size))
    index = advcal.groups_from_ids(uids)
    mask = data.batch["response_mask"]
    shipped = data.select(batch_keys=list(GRAM_FIELDS), non_tensor_batch_keys=["uid"],
                          meta_info_keys=[]).select_idxs(order)
    shipped.meta_info = {
        "temperature": float(temperature),
        "advcal_batch_num_tokens": float(mask.sum()),
        "advcal_global_batch_size": float((mask.sum(dim=1) > 0).sum()),
        "advcal_gram_width": int(np.diff(index.offsets).max(initial=0)),
        "advcal_longest": int(data.batch["attention_mask"].sum(dim=1).max()),
    }
    output = worker_group.compute_advcal_gram(shipped)
    if hasattr(output, "get"):  # a DataProtoFuture
        output = output.get()
    shipped_rows = output.batch[GRAM_KEY]
    rows = torch.empty_like(shipped_rows)
    rows[torch.as_tensor(order)] = shipped_rows
    return rows


def _estimator_is_setgrpo(trainer: Any) -> bool:
    name = trainer.config.algorithm.adv_estimator
    return getattr(name, "value", name) == "setgrpo"


def _use_gram_workers(role_worker_mapping: dict[Any, Any]) -> None:
    """Build the actor's workers (roles ActorRollout, ActorRolloutRef) with the Gram method."""
    import ray
    from ray.actor import ActorClass
    from verl.trainer.ppo.ray_trainer import Role

    for role in (Role.ActorRollout, Role.ActorRolloutRef):
        remote = role_worker_mapping.get(role)
        if isinstance(remote, ActorClass):
            metadata: Any = getattr(remote, "__ray_metadata__")  # noqa: B009
            base = metadata.modified_class.__bases__[0]  # ray.remote subclasses the class
            if not issubclass(base, GramWorkerMixin):
                role_worker_mapping[role] = ray.remote(gram_worker_class(base))


def install() -> None:
    """Hook SetGRPO's Gram pass into verl's ``RayPPOTrainer``.

    After this call, in the process that runs the trainer, a ``RayPPOTrainer`` whose
    ``algorithm.adv_estimator`` is ``setgrpo``:

    * builds its actor workers from :func:`gram_worker_class` (in ``init_workers``);
    * after the old-log-prob pass of each step, runs :func:`gram_from_workers` and carries
      the rows (``batch["advcal_gram"]``) into ``compute_advantage``;
    * computes advantages with this module's :func:`compute_advantage`
      (:func:`patch_compute_advantage`).

    Other estimators run as before.  Calling it again changes nothing.  verl's v1 trainer
    (``trainer.use_v1=True``, verl 0.9's default) is not hooked: run SetGRPO with
    ``trainer.use_v1=False``.
    """
    from verl.trainer.ppo import ray_trainer

    patch_compute_advantage()
    trainer_cls = ray_trainer.RayPPOTrainer
    if getattr(trainer_cls, "_advcal_installed", False):
        return
    init_workers = trainer_cls.init_workers
    old_log_prob = trainer_cls._compute_old_log_prob
    patch: Any = trainer_cls  # verl's methods, replaced by wrappers that call them

    def advcal_init_workers(self: Any) -> Any:
        if _estimator_is_setgrpo(self):
            _use_gram_workers(self.role_worker_mapping)
        return init_workers(self)

    def advcal_compute_old_log_prob(self: Any, batch: Any) -> Any:
        result = old_log_prob(self, batch)
        if _estimator_is_setgrpo(self):
            old, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
            temperature = self.config.actor_rollout_ref.rollout.temperature
            old.batch[GRAM_KEY] = gram_from_workers(self.actor_rollout_wg, batch,
                                                    temperature=float(temperature))
            result = (old, *rest) if rest else old
        return result

    patch.init_workers = advcal_init_workers
    patch._compute_old_log_prob = advcal_compute_old_log_prob
    patch._advcal_installed = True


