"""A fit's options, each declared once, in the spec it belongs to.

- `Measurement` (frozen): what is measured, everything that changes a row's records and so names the row
  (its key in the database, what a journal must match to be resumed): the protocol, |w - mean|, the tensors
  selected, fused tensors split, the spectra.
- `Interpretation` (frozen): how the measurements are read (the trim of the per-kind summaries, the training
  hyperparameters of the lambda axis): the same records, another reading.
- `Running` (frozen): how the fit runs, what `Execution.build` takes (execution.py chooses and checks it there:
  the device, the executor, the connections); never in the row's key.

`FitOptions` holds the three and the model's name (--name): built and read by the flat names as well
(`FitOptions(protocol="exact", device="cpu")`, `options.protocol`), each name routed to its one spec.
Errors name the library's parameter; the command line says its flag.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import OptionError, param
from ..execution import Execution
from ..vocabulary import COHORT_TRIM, PROTOCOLS, TRIMS


@dataclass(frozen=True)
class Measurement:
    """What a fit measures: the row's key (see the module docstring)."""

    protocol: str = "hist1024"
    # Fit |w - mean| as the Weibull paper's App. A.1 text says, instead of |w| as its library and the
    # cohort do (--center).
    center: bool = False
    include: Sequence[str] = ()  # globs of the tensors to read (none: all)
    exclude: Sequence[str] = ()
    split_fused: bool = True  # fit a fused tensor's parts (q/k/v, gate/up) too
    # Each matrix's spectrum too (--spectrum): WeightWatcher's metrics from the eigenvalues of its Gram, in a
    # second pass over the matrices (run/spectrum.py); the row is then weightdiag.row/2.
    spectrum: bool = False
    # FARMS' aspect-ratio-corrected alpha as well (--farms, implies --spectrum): 225 windows of 2000 x 2000 per
    # large matrix, about 100 s for 4096 x 14336 on 2 cores.
    farms: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "include", tuple(self.include or ()))
        object.__setattr__(self, "exclude", tuple(self.exclude or ()))

    @property
    def spectra(self) -> bool:
        """Whether the fit takes the matrices' spectra (--spectrum or --farms)."""
        return self.spectrum or self.farms

    def check(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise OptionError(
                f"{param('protocol')} {self.protocol!r}: choose one of {', '.join(PROTOCOLS)}", param="protocol"
            )


@dataclass(frozen=True)
class Interpretation:
    """How a fit's measurements are read (see the module docstring)."""

    trim: str = COHORT_TRIM  # the trim used for per-kind medians and classes; all three are stored
    # Training hyperparameters for the lambda axis (T/tau); a preset or a step* revision fills gaps.
    lr: float | None = None
    weight_decay: float | None = None
    steps: float | None = None
    preset: str | None = None

    def check(self) -> None:
        from ..diagnose import lambda_axis

        if self.trim not in TRIMS:
            raise OptionError(f"{param('trim')} {self.trim!r}: choose one of {', '.join(TRIMS)}", param="trim")
        for name in ("lr", "weight_decay", "steps"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise OptionError(f"{param(name)} must be a positive finite number, not {value}", param=name)
        lambda_axis.check_preset(self.preset)


@dataclass(frozen=True)
class Running:
    """How a fit runs: what Execution.build takes (see the module docstring)."""

    device: str = "auto"
    # Ranged requests kept in flight when streaming from the Hub (--connections); on a cluster, per task.
    connections: int = 8
    # Where the passes run: "local" (this machine's threads) or "ray" (tasks on the nodes of the Ray cluster at
    # ray_address, else RAY_ADDRESS). The row is the same.
    executor: str = "local"
    ray_address: str | None = None

    def execution(self, threads: int | None = None) -> Execution:
        """The fit's Execution (checked there: exit 2 on an unusable choice); `threads`: a sweep worker's share."""
        return Execution.build(
            self.device,
            executor=self.executor,
            ray_address=self.ray_address,
            connections=self.connections,
            threads=threads,
        )


_SPECS = {"measurement": Measurement, "interpretation": Interpretation, "running": Running}
_OWNER = {f.name: spec for spec, cls in _SPECS.items() for f in fields(cls)}


@dataclass(frozen=True, init=False)
class FitOptions:
    """A fit's options: the three specs and the model's name (see the module docstring). Built and read by the
    flat names too, e.g. FitOptions(protocol="exact", spectrum=True, device="cpu").spectrum."""

    measurement: Measurement = field(default_factory=Measurement)
    interpretation: Interpretation = field(default_factory=Interpretation)
    running: Running = field(default_factory=Running)
    model_id: str | None = None  # --name: the model's id in the row (default: from its path or Hub id)

    def __init__(
        self,
        measurement: Measurement | None = None,
        interpretation: Interpretation | None = None,
        running: Running | None = None,
        model_id: str | None = None,
        **flat: Any,
    ) -> None:
        specs: dict[str, Any] = {
            "measurement": measurement or Measurement(),
            "interpretation": interpretation or Interpretation(),
            "running": running or Running(),
        }
        changes: dict[str, dict[str, Any]] = {name: {} for name in specs}
        for name, value in flat.items():
            if name not in _OWNER:
                raise TypeError(f"FitOptions has no option {name!r}")
            changes[_OWNER[name]][name] = value
        for spec, changed in changes.items():
            if changed:
                specs[spec] = replace(specs[spec], **changed)
            object.__setattr__(self, spec, specs[spec])
        object.__setattr__(self, "model_id", model_id)

    def __getattr__(self, name: str) -> Any:
        """A spec's field by its flat name (options.protocol is options.measurement.protocol)."""
        spec = _OWNER.get(name)
        if spec is None:
            raise AttributeError(f"FitOptions has no option {name!r}")
        return getattr(object.__getattribute__(self, spec), name)

    @property
    def spectra(self) -> bool:
        return self.measurement.spectra

    def changed(self, **flat: Any) -> FitOptions:
        """These options with some changed, by their flat names."""
        return FitOptions(self.measurement, self.interpretation, self.running, self.model_id, **flat)

    def validate(self) -> None:
        """Refuse what is measured or read with unusable values (OptionError, exit 2)."""
        self.measurement.check()
        self.interpretation.check()
