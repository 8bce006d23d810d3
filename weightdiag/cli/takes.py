"""Which options a command takes, said once above it: `@takes("db", "device", ...)` builds the command's
signature from OPTIONS (each option's parameter name, its alias from options.py and its default) and calls the
command with the values as one object, Given (given.device; given.fit_options(), the one place where option
values become FitOptions).

A command keeps its positional arguments (MODEL, BASE TUNED) in its own signature, before its last parameter,
`given: Given`; its options follow them in the order @takes lists them, which is the order of its --help.
"""

import functools
import inspect
from collections.abc import Callable, Mapping
from inspect import Parameter
from typing import Any

from .. import settings
from ..run.options import FitOptions
from .options import OPTIONS


def _name(key: str) -> str:
    """The parameter name of an OPTIONS key ("device@fit": device)."""
    return key.partition("@")[0]


class Given:
    """The values of the options a command takes, by parameter name (given.device). An option the command does not
    take is an AttributeError, never a quiet default."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        """`values`: by OPTIONS key ("device@fit"), as @takes passes them."""
        self._values = dict(values)
        self._by_name = {_name(key): value for key, value in values.items()}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_by_name"][name]
        except KeyError:
            raise AttributeError(f"this command takes no option {name!r}") from None

    def named(self, *names: str) -> dict[str, Any]:
        """These options' values by name, to pass on as keyword arguments of the same names."""
        return {name: getattr(self, name) for name in names}

    def fit_options(self) -> FitOptions:
        """The one place where option values become FitOptions: each option of the command that is a FitOptions
        field (OPTIONS' field: --name is model_id, --train-steps steps); the others keep FitOptions' defaults."""
        return FitOptions(**{field: value for key, value in self._values.items() if (field := OPTIONS[key].field)})


def takes(*keys: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The command's options, by their OPTIONS keys, in the order of its --help (see the module docstring)."""
    unknown = [key for key in keys if key not in OPTIONS]
    if unknown:
        raise ValueError(f"@takes: unknown options {unknown} (options.OPTIONS)")
    names = [_name(key) for key in keys]
    if len(set(names)) < len(names):
        raise ValueError(f"@takes: a parameter name twice in {keys}")

    def build(command: Callable[..., None]) -> Callable[..., None]:
        *arguments, last = inspect.signature(command, eval_str=True).parameters.values()
        if last.annotation is not Given:
            raise TypeError(f"{command.__name__}: its last parameter takes the options (`given: Given`)")
        options = [
            Parameter(_name(key), Parameter.KEYWORD_ONLY, default=OPTIONS[key].default, annotation=OPTIONS[key].alias)
            for key in keys
        ]

        @functools.wraps(command)
        def parsed(**values: Any) -> None:
            given = Given({key: values[_name(key)] for key in keys})
            # --cache-dir is a setting for the whole run (every Hub read of it), not an argument of the API
            with settings.hf_cache_given(values.get("cache_dir")):
                command(*(values[p.name] for p in arguments), **{last.name: given})

        # What Typer reads: inspect.signature(parsed) and typing.get_type_hints(parsed).
        signature = inspect.Signature([*arguments, *options], return_annotation=None)
        parsed.__signature__ = signature  # type: ignore[attr-defined]
        parsed.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()} | {"return": None}
        return parsed

    return build
