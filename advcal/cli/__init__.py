"""The ``advcal`` command line: ``advcal demo`` (a tour on built-in data: estimators, the
scale-diagnostics table, conformal coverage and a SetGRPO run), ``advcal diagnose FILE...``
(scale diagnostics of a reward log), ``advcal calibrate {sets,ranges,threshold}``
(calibration files from logs) and ``advcal warmup`` (the numba kernels compiled into the
on-disk cache ahead of time).

The package, floor by floor (a module imports only those below it):

* ``_errors``: exit codes, :class:`~advcal.cli._errors.CommandError`, which exceptions
  are bad input, one-line messages;
* ``_args``: the shape of a command (``Command``) and the argparse types of the options;
* ``_output``: JSON numbers, the SRGO table, the progress bar, figure and target checks;
* ``diagnose``, ``demo``, ``calibrate``, ``warmup``: one module per command, its ``COMMAND`` (name,
  help, ``add_arguments``, ``run``);
* ``_main``: the parser and the error net, :func:`main`.

The library logic the commands print (cross-fitted coverage, for one) lives in the
library (:mod:`advcal.drift`), not here.
"""

from advcal.cli._args import finite_arg, int_arg, numbers, path_arg, seed_arg
from advcal.cli._errors import (
    EXIT_BAD_INPUT,
    EXIT_CLOSED_PIPE,
    EXIT_INTERRUPTED,
    CommandError,
    bad_input_types,
    describe,
    file_error,
    is_bad_input,
    one_line,
    printable,
)
from advcal.cli._main import build_parser, main
from advcal.cli._output import _Bar as _Bar
from advcal.cli._output import _progress_enabled as _progress_enabled
from advcal.cli._output import _read_progress as _read_progress
from advcal.cli._output import check_plot_target
from advcal.cli.demo import (
    DemoCoverage,
    DemoSetGRPO,
    demo_batch,
    demo_coverage,
    demo_diagnostics,
    demo_reward_log,
    demo_setgrpo,
)
from advcal.cli.demo import _print_setgrpo as _print_setgrpo
from advcal.cli.diagnose import _plot as _plot

# The names tests and docs import; the private ones (imported "as" themselves) are for
# the tests only.
__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CLOSED_PIPE",
    "EXIT_INTERRUPTED",
    "CommandError",
    "DemoCoverage",
    "DemoSetGRPO",
    "bad_input_types",
    "build_parser",
    "check_plot_target",
    "demo_batch",
    "demo_coverage",
    "demo_diagnostics",
    "demo_reward_log",
    "demo_setgrpo",
    "describe",
    "file_error",
    "finite_arg",
    "int_arg",
    "is_bad_input",
    "main",
    "numbers",
    "one_line",
    "path_arg",
    "printable",
    "seed_arg",
]
