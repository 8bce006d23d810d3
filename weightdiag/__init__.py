"""weightdiag: diagnose trained transformer checkpoints from their weights alone.

The library's front (each name imported when first used, so that `import weightdiag` stays cheap):

    import weightdiag as wd
    fitted = wd.fit("path/to/model", wd.FitOptions(spectrum=True), save=False)   # or "ORG/NAME@REV"
    frame = fitted.matrices_frame()                  # pandas, one line per matrix: WeightWatcher's column names
    frame[frame.alpha > 6]
    plan = wd.plan("ORG/NAME")                       # what a fit would read and skip, from headers only
    changes = wd.diff("base/model", "tuned/model")   # DiffResult; changes.matrices_frame()
    kin = wd.lineage("path/to/model")                # LineageReport: derived / independent per database row

Errors are `WeightdiagError`s, each with its `exit_code` (weightdiag.errors). `wd.fit` is also the package of
the Weibull numerics (`weightdiag.fit.weibull`, ...): calling it fits a model.
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .api import (
        Fitted,
        LineageReport,
        Report,
        SweepRun,
        check,
        compare,
        database_frame,
        diff,
        fit,
        lineage,
        matrices_frame,
        plan,
        report,
        sweep,
        trajectory,
    )
    from .delta.result import DiffOptions, DiffResult, TensorDiff
    from .diagnose.results import CheckResult, CompareReport, HealthReport, TrajectoryResult
    from .errors import BadInputError, ExitCode, HubError, MissingDependencyError, WeightdiagError
    from .record.diff_row import DiffRow, TensorChange
    from .record.result import FitResult, KindFit, MatrixFit
    from .record.schema import Row, RowError, read_row
    from .record.table import MATRIX_COLUMNS, matrix_records
    from .run.options import FitOptions
    from .run.plan import Plan, PlannedTensor

# name -> the module that defines it (imported on first use: module __getattr__, PEP 562)
_FRONT = {
    **dict.fromkeys(("Fitted", "Report", "SweepRun", "check", "compare", "database_frame", "diff"), "api"),
    **dict.fromkeys(("plan", "report", "sweep", "trajectory", "lineage", "LineageReport", "matrices_frame"), "api"),
    **dict.fromkeys(("DiffOptions", "DiffResult", "TensorDiff"), "delta.result"),
    **dict.fromkeys(("CheckResult", "CompareReport", "HealthReport", "TrajectoryResult"), "diagnose.results"),
    **dict.fromkeys(("BadInputError", "ExitCode", "HubError", "MissingDependencyError", "WeightdiagError"), "errors"),
    **dict.fromkeys(("Row", "RowError", "read_row"), "record.schema"),
    **dict.fromkeys(("FitResult", "KindFit", "MatrixFit"), "record.result"),
    **dict.fromkeys(("DiffRow", "TensorChange"), "record.diff_row"),
    **dict.fromkeys(("MATRIX_COLUMNS", "matrix_records"), "record.table"),
    "FitOptions": "run.options",
    **dict.fromkeys(("Plan", "PlannedTensor"), "run.plan"),
}

__all__ = [
    "MATRIX_COLUMNS",
    "BadInputError",
    "CheckResult",
    "CompareReport",
    "DiffOptions",
    "DiffResult",
    "DiffRow",
    "ExitCode",
    "FitOptions",
    "FitResult",
    "Fitted",
    "HealthReport",
    "HubError",
    "KindFit",
    "LineageReport",
    "MatrixFit",
    "MissingDependencyError",
    "Plan",
    "PlannedTensor",
    "Report",
    "Row",
    "RowError",
    "SweepRun",
    "TensorChange",
    "TensorDiff",
    "TrajectoryResult",
    "WeightdiagError",
    "__version__",
    "check",
    "compare",
    "database_frame",
    "diff",
    "fit",
    "lineage",
    "matrices_frame",
    "matrix_records",
    "plan",
    "read_row",
    "report",
    "sweep",
    "trajectory",
]


def __getattr__(name: str) -> Any:
    module = _FRONT.get(name)
    if module is None:
        raise AttributeError(f"module 'weightdiag' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FRONT})


class _FitPackage(types.ModuleType):
    """weightdiag.fit is both the stage of the Weibull numerics (a package) and the library's `wd.fit(...)`: the
    package, once imported as weightdiag's attribute, is callable (api.fit), whichever import came first; its
    help and signature are api.fit's (`help(wd.fit)`, `inspect.signature(wd.fit)`), with the stage's after."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .api import fit as fit_model

        return fit_model(*args, **kwargs)

    @property
    def __doc__(self) -> str | None:  # a data descriptor: found before the module's own __doc__
        from .api import fit as fit_model

        return f"{fit_model.__doc__}\n\nThe package: {self.__dict__.get('__doc__')}"

    @__doc__.setter
    def __doc__(self, value: str | None) -> None:
        self.__dict__["__doc__"] = value

    @property
    def __signature__(self) -> Any:
        import inspect

        from .api import fit as fit_model

        return inspect.signature(fit_model)


def _callable_fit_package() -> None:
    from . import fit as package  # its __init__ is a docstring: nothing is loaded

    package.__class__ = _FitPackage


if not TYPE_CHECKING:
    _callable_fit_package()
