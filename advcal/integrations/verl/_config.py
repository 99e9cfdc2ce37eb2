"""The options of advcal's verl estimators and of the worker-side Gram pass: in-process
(:func:`configure`) or, for every Ray worker, as JSON in ``ADVCAL_VERL_OPTIONS``."""

from __future__ import annotations

import json
import os
from typing import Any

OPTIONS_ENV = "ADVCAL_VERL_OPTIONS"
GRAM_KEY = "advcal_gram"
#: verl's ``actor.loss_agg_mode`` values (``verl.trainer.ppo.core_algos.agg_loss``)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")
#: the ``"setgrpo"`` options that configure the worker-side Gram pass, not the estimator
GRAM_OPTIONS = ("gram_layers", "gram_sketch_dim", "gram_seed", "gram_sketch",
                "gram_max_token_len", "loss_agg_mode", "loss_scale_factor")
#: the batch fields the Gram pass reads (verl's padded rollout layout)
GRAM_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")

#: the names advcal registers with verl (``algorithm.adv_estimator``)
ESTIMATOR_NAMES = ("maxnorm", "range_grpo", "setgrpo")

_configured: dict[str, dict[str, Any]] = {}


def configure(estimator: str, **options: Any) -> None:
    """Set the options of one of advcal's verl estimators in this process.

    Parameters
    ----------
    estimator : {"maxnorm", "range_grpo", "setgrpo"}
        The registered name.
    **options
        Its options: ``tau_res`` (and any :func:`advcal.maxnorm` keyword) for
        ``"maxnorm"``; ``calibration`` (a RangeCalibration or its file) and ``relation``
        for ``"range_grpo"``; ``calibration`` (a SetCalibration or its file) and ``tau``
        (a threshold, a ThresholdSelection or its file) for ``"setgrpo"``, with the
        worker-side Gram pass's ``gram_layers``, ``gram_sketch_dim``, ``gram_seed``,
        ``gram_sketch``, ``gram_max_token_len``, ``loss_agg_mode`` and
        ``loss_scale_factor`` (see :func:`compute_gram_rows`).  They take
        precedence over ``ADVCAL_VERL_OPTIONS`` in this process.  Without options, the
        estimator's options set here are cleared, so the environment variable applies
        again.

    Examples
    --------
    >>> from advcal.integrations import verl
    >>> verl.configure("maxnorm", tau_res=0.05)
    >>> verl.configure("bogus")
    Traceback (most recent call last):
    ...
    ValueError: `estimator` must be one of 'maxnorm', 'range_grpo', 'setgrpo'; got 'bogus'.
    >>> verl.configure("maxnorm")  # back to ADVCAL_VERL_OPTIONS
    """
    if estimator not in ESTIMATOR_NAMES:
        raise ValueError(f"`estimator` must be one of {', '.join(map(repr, ESTIMATOR_NAMES))}; "
                         f"got {estimator!r}.")
    if options:
        _configured[estimator] = dict(options)
    else:
        _configured.pop(estimator, None)


def _options(name: str) -> dict[str, Any]:
    if name in _configured:
        return dict(_configured[name])
    text = os.environ.get(OPTIONS_ENV, "")
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{OPTIONS_ENV} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get(name, {}), dict):
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object of objects keyed by estimator, "
                         f'e.g. {{"{name}": {{...}}}}.')
    return dict(parsed.get(name, {}))


def _need(options: dict[str, Any], key: str, name: str, what: str) -> Any:
    if key not in options:
        raise ValueError(f"verl estimator {name!r} needs option {key!r} ({what}): set it with "
                         f"advcal.integrations.verl.configure({name!r}, {key}=...) or in "
                         f"{OPTIONS_ENV}.")
    return options.pop(key)


