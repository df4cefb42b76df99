"""The ground of the configuration: the domain names, the error type, and the strict base class of every section."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, field_validator

from acl_lib import domains

DOMAINS = domains.ORDER  # the training stages, in the study's order (acl_lib.domains)


def check_domains(v: dict) -> dict:
    """A per-domain setting's keys must be domains (``DOMAINS``): the validators of every such field call this."""
    bad = [d for d in v if d not in DOMAINS]
    if bad:
        raise ValueError(f"unknown domain(s) {bad}; domains are {list(DOMAINS)}")
    return v


class ConfigError(ValueError):
    """A bad configuration: raised before any compute."""


def _strict(ann: Any, v: Any) -> Any:
    """``v`` checked against the plain type ``ann`` with no lenient conversions: a bool is not a number and a
    number is not a bool (pydantic's lax mode turns ``eval.k=true`` into 1); floats must be finite. Numeric
    strings stay accepted for floats, because YAML 1.1 reads ``2e-5`` as a string. Lists and dicts are checked
    item by item; other types (sections, ``Literal``) are left to pydantic."""
    origin = get_origin(ann)
    if origin is list and isinstance(v, list):
        (item,) = get_args(ann) or (Any,)
        return [_strict(item, x) for x in v]
    if origin is dict and isinstance(v, dict):
        _, item = get_args(ann) or (Any, Any)
        return {k: _strict(item, x) for k, x in v.items()}
    if origin is Literal:
        if isinstance(v, bool) and not any(isinstance(a, bool) for a in get_args(ann)):
            raise ValueError(f"must be one of {list(get_args(ann))}")
    elif ann is bool:
        if not isinstance(v, bool):
            raise ValueError("must be true or false")
    elif ann is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be an integer")
    elif ann is float:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError("must be a number")
        try:
            x = float(v)
        except ValueError:
            raise ValueError("must be a number") from None
        if not math.isfinite(x):
            raise ValueError("must be a finite number")
        return x
    return v


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_lenient_types(cls, v: Any, info) -> Any:
        return _strict(cls.model_fields[info.field_name].annotation, v)
