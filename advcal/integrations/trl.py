"""advcal advantages inside TRL's ``GRPOTrainer``.

:class:`AdvcalGRPOMixin` replaces the advantages TRL computes with advcal's, at the same
place (per rank, from the rewards TRL has gathered over all ranks) and with TRL's own
conventions wherever advcal has no reason to differ: completions whose reward functions
all returned ``None`` leave their group and get advantage 0 (TRL's rule from 1.6 on; advcal
keeps it with older TRL, which counted them as reward 0), several reward functions are
combined with TRL's ``reward_weights`` and ``multi_objective_aggregation``, and
``advantage="grpo"`` follows TRL's ``scale_rewards`` with TRL's eps of 1e-4.

``advantage="setgrpo"`` computes each group's policy-gradient Gram matrix with
:class:`advcal.torch.GradientCapture` on the forward pass of the loss itself, then writes
SetGRPO's recovered coefficients into the loss in place of the advantages.

``trl`` is imported only when :data:`AdvcalGRPOTrainer` is first used.

Examples
--------
A trainer class of your own (the mixin goes first)::

    from trl import GRPOTrainer
    from advcal.integrations.trl import AdvcalGRPOMixin

    class MyTrainer(AdvcalGRPOMixin, GRPOTrainer):
        pass

    trainer = MyTrainer(model=model, reward_funcs=reward_fn, args=config,
                        train_dataset=dataset, advantage="maxnorm",
                        advantage_options={"tau_res": 0.05})
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

import advcal
from advcal._ggsr import gram_blocks
from advcal._validation import Batch, check_choice, check_keywords, check_real
from advcal.diagnostics import scale_summary
from advcal.integrations._fused_head import head_start
from advcal.layouts import GroupIndex
from advcal.recovery import recover_checked
from advcal.registry import REGISTRY, DiagnosticSettings, Scaled
from advcal.sets import needs_noise_var, sets_checked

if TYPE_CHECKING:
    import torch

# AdvcalGRPOTrainer (the mixin on trl.GRPOTrainer) is built by the module __getattr__.
__all__ = ["MODES", "AdvcalGRPOMixin", "trl_rewards"]

MODES = ("grpo", "dr_grpo", "rloo", "maxnorm", "range", "setgrpo")

# TRL's constant in the denominators of "grpo" (group and batch scaling).
TRL_EPS = 1e-4


class _Settings(NamedTuple):
    mode: str
    options: dict[str, Any]
    calibration: Any
    tau: Any
    layers: Any
    sketch_dim: int | None
    seed: int


def _load(calibration: Any) -> Any:
    if isinstance(calibration, (str, os.PathLike)):
        return advcal.load_calibration(calibration)
    return calibration


def _settings_iv(advantage: Any, options: Any, calibration: Any, tau: Any, layers: Any,
                 sketch_dim: Any, seed: Any) -> _Settings:
    mode = check_choice(advantage, "advantage", MODES)
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(f"`advantage_options` must be a mapping; got {type(options).__name__}.")
    options = dict(options)
    calibration = _load(calibration)
    if mode == "range" and not isinstance(calibration, advcal.RangeCalibration):
        raise ValueError("advantage='range' needs `calibration`: a RangeCalibration "
                         "(advcal.calibrate_ranges) or the path of one saved with "
                         "advcal.save_calibration.")
    if mode == "setgrpo":
        if not isinstance(calibration, advcal.SetCalibration):
            raise ValueError("advantage='setgrpo' needs `calibration`: a SetCalibration "
                             "(advcal.calibrate_sets) or the path of one saved with "
                             "advcal.save_calibration.")
        if needs_noise_var(calibration):
            raise ValueError("advantage='setgrpo' needs a calibration with noise='isotropic' "
                             "(or shape='isotropic'): a diagonal one needs per-response grader "
                             "variances, which TRL's rewards do not come with.")
        tau = _load(tau)
        if tau is None:
            raise ValueError("advantage='setgrpo' needs `tau`: a threshold in [0, 1) or a "
                             "ThresholdSelection (advcal.select_threshold) or its path.")
        # Checked once here, not at every batch.
        if isinstance(tau, advcal.ThresholdSelection):
            from advcal.risk import validate_threshold_selection

            validate_threshold_selection(tau)
        else:
            tau = check_real(tau, "tau", low=0.0, high=1.0, high_inclusive=False)
    elif tau is not None:
        raise ValueError(f"`tau` is for advantage='setgrpo'; got advantage={mode!r}.")
    # Checked once here, so that each batch calls the estimator directly ("grpo" may run
    # grpo, batch_std or dr_grpo by TRL's scale_rewards: its options must suit grpo).
    if mode == "range":
        check_keywords(advcal.range_advantages, mode, options)
    elif mode == "setgrpo":
        if options:
            raise ValueError("advantage='setgrpo' takes no advantage_options: its options "
                             "are `calibration`, `tau` and the gram_* arguments.")
    else:
        check_keywords(REGISTRY[mode].function, mode, options)
    if mode == "maxnorm" and "tau_res" not in options:
        raise ValueError("advantage='maxnorm' needs advantage_options={'tau_res': ...}: the "
                         "reward resolution below which gaps are not trusted.")
    if sketch_dim is not None and (isinstance(sketch_dim, bool) or not isinstance(sketch_dim, int)
                                   or sketch_dim < 1):
        raise ValueError(f"`gram_sketch_dim` must be a positive int or None; got {sketch_dim!r}.")
    return _Settings(mode, options, calibration, tau, layers, sketch_dim, int(seed))


def trl_rewards(rewards_per_func: np.ndarray, weights: np.ndarray, aggregation: str,
                group_size: int) -> np.ndarray:
    """TRL's combined reward per completion, as its ``GRPOTrainer`` combines them.

    Parameters
    ----------
    rewards_per_func : ndarray, shape (N, F)
        One column per reward function, NaN where it returned ``None``; groups of
        ``group_size`` consecutive completions.
    weights : ndarray, shape (F,)
        TRL's ``reward_weights``.
    aggregation : {"sum_then_normalize", "normalize_then_sum"}
        TRL's ``multi_objective_aggregation``: the weighted sum of the rewards that are not
        ``None``; or each reward function first normalised within the group (mean and
        unbiased std of its non-``None`` rewards, TRL's 1e-4 in the denominator), then the
        weighted sum.
    group_size : int
        TRL's ``num_generations``.

    Returns
    -------
    ndarray of float64, shape (N // group_size, group_size)
        The combined rewards; NaN where every reward function returned ``None`` (the
        completion leaves its group).

    Examples
    --------
    >>> import numpy as np
    >>> from advcal.integrations.trl import trl_rewards
    >>> per_func = np.array([[1.0, np.nan], [np.nan, np.nan], [0.5, 2.0], [np.nan, 1.0]])
    >>> trl_rewards(per_func, np.array([1.0, 0.5]), "sum_then_normalize", 2)
    array([[1. , nan],
           [1.5, 0.5]])
    """
    per_func = np.asarray(rewards_per_func)
    if per_func.dtype.kind != "f":
        per_func = per_func.astype(np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if (per_func.shape[1] == 1 and aggregation == "sum_then_normalize"
            and math.isfinite(weights[0]) and weights[0] != 0):
        # One reward function: its weighted reward, NaN exactly where it returned None
        # (a finite nonzero weight makes no NaN of its own, as inf * 0 would).
        return np.multiply(per_func[:, 0], weights[0], dtype=np.float64).reshape(-1, group_size)
    per_func = per_func.astype(np.float64, copy=False)
    unscorable = np.isnan(per_func).all(axis=1)
    if aggregation == "normalize_then_sum":
        grouped = per_func.reshape(-1, group_size, per_func.shape[1])
        count = (~np.isnan(grouped)).sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            # NaN where a function scored nothing in the group, as TRL's nanmean gives.
            mean = np.nansum(grouped, axis=1, keepdims=True) / count
            var = np.nansum((grouped - mean) ** 2, axis=1, keepdims=True) / (count - 1)
        std = np.sqrt(var) if group_size > 1 else np.zeros_like(mean)
        per_func = ((grouped - mean) / (std + TRL_EPS)).reshape(per_func.shape)
    elif aggregation != "sum_then_normalize":
        raise ValueError(f"unknown multi_objective_aggregation {aggregation!r}")
    combined = np.nansum(per_func * weights, axis=1)
    combined[unscorable] = np.nan
    return combined.reshape(-1, group_size)


# How advcal's scale rules run inside the trainer: TRL's eps, the numba engine (maxnorm's
# tau_res, required, always comes from advantage_options).
_RULES = DiagnosticSettings(eps=TRL_EPS, tau_res=math.inf, resolution=None, backend="numba")


def _metrics(scaled: Scaled, scorable: np.ndarray) -> dict[str, float]:
    """The logged scale metrics: :func:`advcal.scale_diagnostics`'s for the rule's
    estimator (the registry's scale rule, summarised by the diagnostics' own code);
    ``scorable``: the groups with two or more responses."""
    summary = scale_summary(scaled, scorable)
    return {
        "inverse_scale_p50": summary.p50,
        "inverse_scale_p95": summary.p95,
        "inverse_scale_p99": summary.p99,
        "inverse_scale_max": summary.top,
        "zero_gap_fraction": summary.zero_gap_fraction,
    }


def _grouped(rewards: np.ndarray, estimator: str, options: dict[str, Any]
             ) -> tuple[Scaled, np.ndarray]:
    """A registered estimator's advantages and per-group scales of a ``(B, G)`` batch of
    rewards, NaN (unscorable) left out of its group with advantage 0, as TRL does; and
    which groups have two or more responses (the rule says which have two valid ones)."""
    n_groups, group_size = rewards.shape
    values = rewards.ravel()
    offsets = np.arange(0, values.size + 1, group_size, dtype=np.int64)
    if np.isnan(values).any():  # the NaN-free kernels are the faster ones
        options = {**options, "nan_policy": "omit"}
    scaled = REGISTRY[estimator].scale(values, offsets, _RULES, options)
    return scaled, np.full(n_groups, group_size >= 2)


def _head(model: Any) -> Any:
    """The model's LM head module, or None."""
    get_head = getattr(model, "get_output_embeddings", None)
    return get_head() if callable(get_head) else None


def _default_layers(model: Any) -> Any:
    """``gram_layers=None``: every linear layer but the LM head.  TRL's fused head reads its
    weight without calling it (no hook would see it); an older TRL calls it, then divides
    its output by the temperature in place (the recorded output is then not the one the
    gradient flows through)."""
    head = _head(model)

    def select(name: str, module: Any) -> bool:
        return module is not head

    return select


class AdvcalGRPOMixin:
    """Put advcal's advantages into a TRL ``GRPOTrainer`` (mix in before ``GRPOTrainer``).

    Parameters (keyword-only, besides those of ``GRPOTrainer``)
    ----------
    advantage : {"grpo", "dr_grpo", "rloo", "maxnorm", "range", "setgrpo"}, default "grpo"
        ``"grpo"`` follows TRL's ``scale_rewards`` ("group": :func:`advcal.grpo`, "batch":
        :func:`advcal.batch_std`, "none": :func:`advcal.dr_grpo`) with TRL's eps 1e-4; with
        ``multi_objective_aggregation="normalize_then_sum"`` the summed rewards are
        normalised over the whole batch, as TRL does.  ``"range"`` reads the combined
        reward as a judge score and turns it into a conformal range with ``calibration``.
    advantage_options : mapping, optional
        Keyword options of the estimator (``{"tau_res": 0.05}`` for ``"maxnorm"``,
        ``{"relation": "midpoint"}`` for ``"range"``, ``{"eps": ...}`` for ``"grpo"``).
    calibration : RangeCalibration, SetCalibration or path, optional
        Required by ``"range"`` and ``"setgrpo"``; a path is read with
        :func:`advcal.load_calibration`.
    tau : float, ThresholdSelection or path, optional
        SetGRPO's threshold (required by ``"setgrpo"``).
    gram_layers, gram_sketch_dim, gram_seed
        :class:`advcal.torch.GradientCapture`'s ``layers``, ``sketch_dim`` and ``seed``
        for ``"setgrpo"``; ``gram_layers=None`` selects every linear layer but the LM head
        (TRL's fused head reads its weight without calling it; an older TRL calls it, then
        divides its output in place, so no hook records what the gradient flows through).  The
        layers are resolved at the first loss and reused (a predicate is asked then), and
        resolved again when the model's modules or the ``requires_grad`` of its linear
        layers change.

    Notes
    -----
    ``"setgrpo"`` with ``steps_per_generation=1`` takes K from the loss's own forward pass;
    with more steps per generation (TRL shuffles a generation batch over them, so no step
    sees a whole group) from a Gram pass of its own when the batch is generated, one more
    forward pass per generation, whose objectives must be normalised as the loss will
    normalise them (``loss_type="bnpo"`` is refused there).  Where each rank holds whole
    groups gradients never leave their rank.  Where a group is split over ranks, each
    rank's per-response gradient rows (:meth:`advcal.torch.GradientCapture.rows`) are
    all-gathered, and every rank runs SetGRPO on the whole generation batch: set
    ``gram_sketch_dim`` (or cover LoRA adapters), since exact rows are whole per-response
    gradients.  Its calibration
    must not be ``noise="diagonal"`` with ``shape="joint"`` (TRL's rewards carry no
    per-response grader variances), and its rewards must be finite (``None`` is fine).

    Metrics logged through TRL (prefix ``advcal/``): ``inverse_scale_p50``/``p95``/``p99``/
    ``max`` and ``zero_gap_fraction`` in every mode, as :func:`advcal.scale_diagnostics`
    gives them for the estimator that ran (GRPO's for ``"setgrpo"``, Range-GRPO's on the
    ranges for ``"range"``), from the same scale rule; ``accepted_fraction``, ``eta_mean``,
    ``tau``, and
    ``coef_norm_ratio`` (‖a(η*)‖ over ‖GRPO coefficients‖, accepted groups) for
    ``"setgrpo"``;
    ``range_width_mean`` for ``"range"``.
    """

    # SetGRPO's layout (set by _check_whole_groups): K computed when the batch is generated
    # (steps_per_generation > 1), and groups split over ranks (rows gathered).
    _advcal_at_generation = False
    _advcal_split = False

    def __init__(self, *args: Any, advantage: str = "grpo",
                 advantage_options: Mapping[str, Any] | None = None,
                 calibration: Any = None, tau: Any = None, gram_layers: Any = None,
                 gram_sketch_dim: int | None = None, gram_seed: int = 0,
                 **kwargs: Any) -> None:
        self._advcal = _settings_iv(advantage, advantage_options, calibration, tau,
                                    gram_layers, gram_sketch_dim, gram_seed)
        self._advcal_rewards_per_func: torch.Tensor | None = None
        self._advcal_capture: Any = None
        self._advcal_inputs: dict[str, Any] | None = None
        # TRL's own advantages of the last batch, kept for comparison and tests.
        self.trl_advantages: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        if self._advcal.mode == "setgrpo":
            self._check_whole_groups()

    # -- where TRL computes its advantages ------------------------------------------------

    def _check_whole_groups(self) -> None:
        args = self.args  # type: ignore[attr-defined]
        # With steps_per_generation > 1, TRL shuffles a generation batch over several steps
        # of the loss, so no loss sees a whole group: K is computed when the batch is
        # generated, by a Gram pass of its own (whole groups per forward).
        self._advcal_at_generation = args.steps_per_generation != 1
        if self._advcal_at_generation and self.loss_type == "bnpo":  # type: ignore[attr-defined]
            raise ValueError(
                "advantage='setgrpo' with steps_per_generation > 1 cannot take "
                "loss_type='bnpo': each step of the loss divides by its own token count, "
                "unknown when the batch is generated; use 'dapo' (TRL's default), 'grpo' or "
                "'dr_grpo', or steps_per_generation=1.")
        # A group split over ranks (a rank's share of the generation batch not a multiple
        # of num_generations): each rank's gradient rows are gathered.
        per_rank = args.per_device_train_batch_size * args.steps_per_generation
        self._advcal_split = bool(per_rank % self.num_generations)  # type: ignore[attr-defined]

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)  # type: ignore[misc]
        self._advcal_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        import torch

        output = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        mode = "train" if self.model.training else "eval"  # type: ignore[attr-defined]
        group_size = (self.num_generations if mode == "train"  # type: ignore[attr-defined]
                      else self.num_generations_eval)  # type: ignore[attr-defined]
        assert self._advcal_rewards_per_func is not None
        rewards = trl_rewards(self._advcal_rewards_per_func.detach().cpu().numpy(),
                              self.reward_weights.cpu().numpy(),  # type: ignore[attr-defined]
                              self.multi_objective_aggregation,  # type: ignore[attr-defined]
                              group_size)
        local = output["advantages"]
        # TRL's own, kept for comparison: a copy where the output still holds the tensor
        self.trl_advantages = local.detach()
        start = self.accelerator.process_index * local.shape[0]  # type: ignore[attr-defined]
        part = slice(start, start + local.shape[0])
        if self._advcal.mode == "setgrpo":
            # The coefficients need the Gram matrices of the loss's own forward pass.
            self.trl_advantages = self.trl_advantages.clone()
            metrics = _metrics(*_grouped(rewards, "grpo", {}))
            output["advcal_rewards"] = torch.as_tensor(rewards.ravel()[part], device=local.device)
            index = torch.arange(part.start, part.stop, device=local.device)
            output["advcal_group"] = index // group_size
            output["advcal_index"] = index  # the response's place in the generation batch
            if mode == "train" and self._advcal_at_generation:
                output["advantages"] = self._setgrpo_at_generation(output).to(local.dtype)
        else:
            advantages, metrics = self._advcal_advantages(rewards)
            mine = advantages.ravel()[part]
            if local.dtype == torch.float32:  # cast by numpy: torch's own cast is slower
                mine = mine.astype(np.float32)
            output["advantages"] = torch.as_tensor(mine, dtype=local.dtype, device=local.device)
        self._advcal_log(mode, metrics)
        return output

    def _advcal_advantages(self, rewards: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """advcal's advantages of a ``(B, G)`` batch of combined rewards (NaN: unscorable),
        and the batch's metrics (scale quantiles, zero-gap fraction, mode-specific ones):
        both from the registry's scale rule of the estimator the mode runs."""
        settings = self._advcal
        options = dict(settings.options)
        if settings.mode == "range":
            return self._range_advantages(rewards, options)
        estimator = settings.mode
        if estimator == "grpo":
            if self.multi_objective_aggregation == "normalize_then_sum":  # type: ignore[attr-defined]
                # TRL normalises the summed, already group-normalised rewards batch-wide:
                # GRPO over the whole batch as one group.
                scaled, scorable = _grouped(rewards.reshape(1, -1), "grpo", options)
                return scaled.weights.reshape(rewards.shape), _metrics(scaled, scorable)
            scaling = self.scale_rewards  # type: ignore[attr-defined]
            if scaling == "none":
                estimator = "dr_grpo"
                for keyword in ("eps", "ddof", "std_floor"):  # grpo's, not dr_grpo's
                    options.pop(keyword, None)
            elif scaling == "batch":
                estimator = "batch_std"
                options.pop("std_floor", None)
        scaled, scorable = _grouped(rewards, estimator, options)
        return scaled.weights.reshape(rewards.shape), _metrics(scaled, scorable)

    def _range_advantages(self, rewards: np.ndarray, options: dict[str, Any]
                          ) -> tuple[np.ndarray, dict[str, float]]:
        """Range-GRPO on the conformal ranges of the scorable rewards (a ragged batch:
        ranges take no NaN), scattered back with advantage 0 for the unscorable."""
        valid = ~np.isnan(rewards)
        offsets = np.zeros(rewards.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.count_nonzero(valid, axis=1), out=offsets[1:])
        where = np.flatnonzero(valid)
        values = rewards.ravel()[where]
        ranges = self._advcal.calibration.ranges(values)
        scaled = REGISTRY["range"].scale(values, offsets, _RULES,
                                         {"lo": ranges.lo, "hi": ranges.hi, **options})
        metrics = _metrics(scaled, np.diff(offsets) >= 2)
        metrics["range_width_mean"] = float(np.mean(ranges.hi - ranges.lo)) if values.size else 0.0
        advantages = np.zeros(rewards.size)
        advantages[where] = scaled.weights
        return advantages.reshape(rewards.shape), metrics

    def _advcal_log(self, mode: str, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            if value is not None and math.isfinite(value):
                self._metrics[mode][f"advcal/{name}"].append(float(value))  # type: ignore[attr-defined]

    # -- SetGRPO: the Gram matrices of the loss's own forward pass ------------------------

    def _advcal_capture_of(self, model: Any) -> Any:
        """A GradientCapture of the policy under ``model`` (unwrapped) with the layers of
        the settings: resolved once, and again only when the model's modules or their
        requires_grad change."""
        from advcal.torch import GradientCapture, LayerSelection

        settings = self._advcal
        # Unwrapping asks accelerate which wrappers exist: once per wrapper object.
        unwrapped = getattr(self, "_advcal_unwrapped", None)
        if unwrapped is None or unwrapped[0] is not model:
            unwrapped = (model, self.accelerator.unwrap_model(model))  # type: ignore[attr-defined]
            self._advcal_unwrapped = unwrapped
        selection = getattr(self, "_advcal_selection", None)
        if selection is None or selection.model is not unwrapped[1] or not selection.current():
            selection = LayerSelection(unwrapped[1], _default_layers(unwrapped[1])
                                   if settings.layers is None else settings.layers)
            self._advcal_selection = selection
        return GradientCapture(unwrapped[1], selection, sketch_dim=settings.sketch_dim,
                               seed=settings.seed)

    def _setgrpo_at_generation(self, output: dict[str, Any]) -> torch.Tensor:
        """SetGRPO's coefficients of a rank's generation batch, from a Gram pass of its own:
        a grad-enabled forward of the policy (unwrapped: no data-parallel hooks), in chunks
        of at most ``per_device_train_batch_size`` responses, whole groups where each rank
        holds whole groups (their K directly), otherwise each chunk's gradient rows,
        gathered over the ranks."""
        import torch

        model = self.model  # type: ignore[attr-defined]
        net = self.accelerator.unwrap_model(model)  # type: ignore[attr-defined]
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        keep = output["completion_ids"].size(1)
        n = ids.shape[0]
        step = self.args.per_device_train_batch_size  # type: ignore[attr-defined]
        g = self.num_generations  # type: ignore[attr-defined]
        if not self._advcal_split:
            step = max(g, step - step % g)  # whole groups per forward

        def chunk(a: int) -> tuple[Any, torch.Tensor]:
            inputs: dict[str, Any] = {key: output[key][a:a + step]
                                      for key in ("completion_mask", "tool_mask")
                                      if key in output}
            inputs["num_items_in_batch"] = output.get("num_items_in_batch")
            with self._advcal_capture_of(model) as capture, torch.enable_grad():
                logps = self._get_per_token_logps_and_entropies(
                    net, ids[a:a + step], attention[a:a + step], keep)[0]
            return capture, self._setgrpo_objectives(logps, inputs)

        if self._advcal_split:
            parts = []
            for a in range(0, n, step):
                capture, objectives = chunk(a)
                parts.append(capture.rows(objectives, start=head_start(objectives)))
                del capture, objectives
            coefficients = self._setgrpo_from_rows(torch.cat(parts), output)
        else:
            blocks = []
            for a in range(0, n, step):
                capture, objectives = chunk(a)
                blocks.append(capture.gram(objectives, group_size=g,
                                           start=head_start(objectives)).reshape(-1))
                del capture, objectives
            # rows in generation order: groups contiguous and in order, as the layout's
            coefficients = self._setgrpo_step(
                output["advcal_group"].cpu().numpy(),
                np.asarray(output["advcal_rewards"].detach().cpu().numpy(), dtype=np.float64),
                lambda layout: np.concatenate(blocks))
        return torch.as_tensor(coefficients, device=output["advantages"].device)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        if self._advcal.mode != "setgrpo" or not model.training or self._advcal_at_generation:
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        capture = self._advcal_capture_of(model)
        with capture:
            self._advcal_capture = capture
            self._advcal_inputs = inputs
            try:
                return super()._compute_loss(model, inputs)  # type: ignore[misc]
            finally:
                self._advcal_capture = None
                self._advcal_inputs = None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)  # type: ignore[misc]
        capture, inputs = self._advcal_capture, self._advcal_inputs
        if capture is not None and inputs is not None:
            self._advcal_capture = None  # the first forward of the loss is the policy's
            inputs["advantages"] = self._setgrpo_coefficients(capture, inputs, out[0])
        return out

    def _setgrpo_objectives(self, per_token_logps: torch.Tensor, inputs: dict[str, Any]
                            ) -> torch.Tensor:
        """J_i of the batch ``inputs``, normalised as TRL's loss normalises them."""
        from advcal.torch import response_objectives

        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        loss_type = self.loss_type  # type: ignore[attr-defined]
        return response_objectives(
            per_token_logps, mask,
            loss_type=loss_type if loss_type in ("grpo", "dr_grpo", "bnpo", "dapo") else "grpo",
            max_completion_length=self.max_completion_length,  # type: ignore[attr-defined]
            num_items_in_batch=inputs.get("num_items_in_batch"),
            num_processes=self.accelerator.num_processes,  # type: ignore[attr-defined]
        )

    def _setgrpo_coefficients(self, capture: Any, inputs: dict[str, Any],
                              per_token_logps: torch.Tensor) -> torch.Tensor:
        """SetGRPO's coefficients of the loss's batch, with K from the loss's own forward
        pass (each rank's rows gathered where groups span ranks)."""
        import torch

        objectives = self._setgrpo_objectives(per_token_logps, inputs)
        # The backward starts below TRL's fused LM head where that gives the same K.
        start = head_start(objectives)
        if self._advcal_split:
            coefficients = self._setgrpo_from_rows(capture.rows(objectives, start=start),
                                                   inputs)
        else:
            coefficients = self._setgrpo_step(
                inputs["advcal_group"].cpu().numpy(),
                np.asarray(inputs["advcal_rewards"].detach().cpu().numpy(), dtype=np.float64),
                lambda layout: capture.gram(objectives, group_ids=layout, start=start))
        return torch.as_tensor(coefficients, dtype=per_token_logps.dtype,
                               device=per_token_logps.device)

    def _setgrpo_from_rows(self, rows: torch.Tensor, inputs: dict[str, Any]) -> np.ndarray:
        """SetGRPO's coefficients of this rank's responses from their gradient rows: every
        rank's rows and responses gathered, the step run on the whole generation batch."""
        import torch

        from advcal.torch import gather_rows, gram_from_rows

        index = inputs["advcal_index"]
        meta = torch.stack([index.to(torch.float64), inputs["advcal_group"].to(torch.float64),
                            inputs["advcal_rewards"].to(torch.float64)], dim=1)
        if self.accelerator.num_processes > 1:  # type: ignore[attr-defined]
            rows = gather_rows(rows)
            meta = gather_rows(meta.to(rows.device))
        table = meta.cpu().numpy()
        every = np.argsort(table[:, 0], kind="stable")
        rows = rows[torch.as_tensor(every, device=rows.device)]
        coefficients = self._setgrpo_step(
            table[every, 1].astype(np.int64), table[every, 2],
            lambda layout: gram_from_rows(rows, group_ids=layout))
        return coefficients[np.searchsorted(table[every, 0], index.cpu().numpy())]

    def _setgrpo_step(self, groups: np.ndarray, rewards: np.ndarray,
                      gram_of: Any) -> np.ndarray:
        """SetGRPO on responses with group numbers ``groups`` and combined ``rewards`` (NaN:
        unscorable), K from ``gram_of(layout)``; the coefficients in the responses' order,
        and the step's metrics logged."""
        # TRL shuffles the batch before the loss: one stable sort groups the rows (by group
        # number, rows in batch order), and the Gram blocks come in that layout.
        order = np.argsort(groups, kind="stable")
        ordered = groups[order]
        bounds = np.concatenate(([0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1,
                                 [groups.size]))
        gram = gram_of(GroupIndex(bounds, order, ordered[bounds[:-1]]))
        sizes = np.diff(bounds)
        if not np.isnan(rewards).any():
            keep, offsets, kept_sizes, blocks = order, bounds, sizes, [gram]
        else:  # unscorable completions leave their group: drop their rows and columns
            rows, blocks, kept = [], [], []
            block_start = 0
            for start, size in zip(bounds[:-1], sizes, strict=True):
                members = order[start:start + size]
                block = gram[block_start:block_start + size * size].reshape(size, size)
                block_start += size * size
                valid = ~np.isnan(rewards[members])
                rows.append(members[valid])
                blocks.append(block[np.ix_(valid, valid)].ravel())
                kept.append(int(valid.sum()))
            keep, kept_sizes = np.concatenate(rows), np.asarray(kept)
            offsets = advcal.offsets_from_sizes(kept)
        settings = self._advcal
        values = rewards[keep]
        if not np.isfinite(values).all():
            raise ValueError("advantage='setgrpo': the rewards must be finite (None is fine: "
                             "it leaves the group); got inf.")
        gram = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        # advcal.setgrpo's two steps, on arguments checked here and at init, so that the
        # sets (and their centres, for the metrics) are built once.
        sets = sets_checked(Batch(values, offsets), values, settings.calibration,
                     settings.calibration.noise_var)
        threshold = settings.tau
        if isinstance(threshold, advcal.ThresholdSelection):
            threshold = threshold.tau_sel
        if threshold is None:  # no feasible threshold: setgrpo rejects every group
            result = advcal.setgrpo(values, offsets, gram=gram, calibration=settings.calibration,
                                    tau=None)
        else:
            result = recover_checked(sets, gram_blocks(sets, gram), threshold)
        coefficients = np.zeros(groups.size)
        coefficients[keep] = result.coefficients
        informative = np.diff(offsets) >= 2
        center = sets.geometry.centers  # float64 in the grouped order, as ``values``
        member_of = np.repeat(np.arange(len(kept_sizes)), kept_sizes)
        norms = np.sqrt(np.bincount(member_of, center ** 2, minlength=len(kept_sizes)))
        recovered = np.sqrt(np.bincount(member_of, result.coefficients ** 2,
                                        minlength=len(kept_sizes)))
        ratio_at = informative & result.accepted & (norms > 0)
        tau = settings.tau
        self._advcal_log("train", {
            "accepted_fraction": float(np.mean(result.accepted[informative]))
            if informative.any() else math.nan,
            "eta_mean": float(np.mean(result.eta[informative])) if informative.any() else math.nan,
            "tau": float(tau if not isinstance(tau, advcal.ThresholdSelection) else
                         (tau.tau_sel if tau.tau_sel is not None else math.nan)),
            "coef_norm_ratio": float(np.mean(recovered[ratio_at] / norms[ratio_at]))
            if ratio_at.any() else math.nan,
        })
        return coefficients


def __getattr__(name: str) -> Any:
    # AdvcalGRPOTrainer = AdvcalGRPOMixin + trl.GRPOTrainer, built on first use.
    if name == "AdvcalGRPOTrainer":
        from trl import GRPOTrainer

        cls = type("AdvcalGRPOTrainer", (AdvcalGRPOMixin, GRPOTrainer),
                   {"__module__": __name__, "__doc__": AdvcalGRPOMixin.__doc__})
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
