"""Builders' argument checks, and binding each config group node to its builder's signature.

A builder declares what its arguments may be with :func:`checked`; the same checks run when it
is called and, through :func:`check_node`, at start-up before any data is loaded, so a bad value
fails in one line naming the key (``scheduler.step_size=0 is out of range: ...``) instead of a
traceback epochs later. (torchtune's ``config.validate`` binds nodes to signatures the same way.)
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from utils.errors import UserError


@dataclass(frozen=True)
class Rule:
    test: Callable[[Any], bool]
    expected: str

    def check(self, key: str, value: Any) -> None:
        try:
            ok = self.test(value)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise UserError(
                f"{key}={shown_value(value)} is out of range: it must be {self.expected}"
            )


def shown_value(value: Any) -> str:
    """A key's value as an error or warning line shows it: a list (a tuple, a ListConfig) as
    [a, b], a string quoted."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, Sequence):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def finite_number(value: Any) -> bool:
    """A finite int or float: inf and nan pass no range check (an infinite MixUp alpha would
    never finish drawing)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


POSITIVE_INT = Rule(lambda v: _whole(v) and v >= 1, "a whole number, 1 or more")
NON_NEGATIVE_INT = Rule(lambda v: _whole(v) and v >= 0, "a whole number, 0 or more")
POSITIVE = Rule(lambda v: finite_number(v) and v > 0, "greater than 0")
NON_NEGATIVE = Rule(lambda v: finite_number(v) and v >= 0, "0 or more")
DROPOUT = Rule(lambda v: finite_number(v) and 0 <= v < 1, "at least 0 and below 1")
UNIT_INTERVAL = Rule(lambda v: finite_number(v) and 0 <= v <= 1, "between 0 and 1")
POSITIVE_OR_NULL = Rule(
    lambda v: v is None or (finite_number(v) and v > 0), "greater than 0, or null"
)
BELOW_ONE = Rule(lambda v: finite_number(v) and 0 < v < 1, "greater than 0 and below 1")
POSITIVE_INTS = Rule(
    lambda v: len(v) >= 1 and all(_whole(x) and x >= 1 for x in v),
    "a list of whole numbers, each 1 or more",
)


def one_of(*choices: Any) -> Rule:
    return Rule(lambda v: v in choices, "one of " + ", ".join(map(str, choices)))


MAX_IMAGE_PIXELS = 2**24  # 4,096 × 4,096 after resizing: a bound on what each image decodes to


def pair_of_positive_ints() -> Rule:
    """``[height, width]`` of an image size, at most :data:`MAX_IMAGE_PIXELS` pixels: a stored
    config read by evaluate.py cannot make every image decode to gigabytes."""
    return Rule(
        lambda v: (
            len(v) == 2 and all(_whole(x) and x >= 1 for x in v) and v[0] * v[1] <= MAX_IMAGE_PIXELS
        ),
        f"two whole numbers [height, width], each 1 or more, at most {MAX_IMAGE_PIXELS:,} "
        "pixels in all",
    )


def checked(group: str, **rules: Rule) -> Callable:
    """Declare a builder's argument checks; they run on every call, and :func:`check_node`
    runs them on a config node before anything is built. ``group`` names the config group in
    messages (``model.hidden_sizes``)."""

    def decorate(builder: Callable) -> Callable:
        signature = inspect.signature(builder)

        @functools.wraps(builder)
        def build(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs).arguments
            check_values(group, bound, rules)
            return builder(*args, **kwargs)

        build.argument_rules = rules  # type: ignore[attr-defined]
        return build

    return decorate


def check_values(group: str, values: Mapping[str, Any], rules: Mapping[str, Rule]) -> None:
    for name, rule in rules.items():
        if name in values:
            rule.check(f"{group}.{name}", values[name])


def check_node(
    group: str, node: Mapping[str, Any], target: Any, supplied: tuple[str, ...] = ()
) -> None:
    """Bind config ``node`` (plain values) of ``group`` to ``target``'s signature: every key a
    parameter, every required parameter given (or in ``supplied``, the arguments train.py
    passes in, which the config may not set: the supplied value would replace it unsaid),
    then run the builder's own argument checks."""
    signature = inspect.signature(target)
    parameters = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    given = [key for key in node if not str(key).startswith("_")]
    name = node.get("_target_") or f"{target.__module__}.{target.__qualname__}"
    accepted = [
        p.name
        for p in parameters.values()
        if p.name not in supplied and p.kind is not p.VAR_KEYWORD
    ]
    for key in given:
        if key in supplied:
            raise UserError(
                f"{group}.{key} is not a setting: train.py passes it to {name} from the data "
                "(or the run); remove it"
            )
        if key not in parameters and not takes_any:
            raise UserError(
                f"{group}.{key} is not a parameter of {name}; it takes {', '.join(accepted)}"
            )
    for parameter in parameters.values():
        required = parameter.default is parameter.empty and parameter.kind in (
            parameter.POSITIONAL_OR_KEYWORD,
            parameter.KEYWORD_ONLY,
        )
        if required and parameter.name not in given and parameter.name not in supplied:
            raise UserError(
                f"{group}.{parameter.name} is required by {name}; pass {group}.{parameter.name}=..."
            )
    check_values(group, node, getattr(target, "argument_rules", {}))
