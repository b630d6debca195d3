"""Form and query parameters as the stripe SDK encodes them, read strictly: an unknown or
malformed parameter is Stripe's 400, never silently ignored."""

from __future__ import annotations

import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from durable_assets.payments.params import StripeApiError, invalid_request

_NESTED = re.compile(r"^([A-Za-z_]+)\[(.*)\]$")
_INTEGER = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True)
class Params:
    """Form or query parameters as the stripe SDK encodes them (``metadata[k]=v``)."""

    values: dict[str, str]
    metadata: dict[str, str] | None
    expand: tuple[str, ...] = ()


def parse_params(encoded: str) -> Params:
    """Decodes Stripe's bracket notation; only ``metadata`` may be nested in this API subset."""
    values: dict[str, str] = {}
    metadata: dict[str, str] | None = None
    expand: list[str] = []
    for name, value in parse_qsl(encoded, keep_blank_values=True):
        nested = _NESTED.match(name)
        if nested and nested.group(1) == "expand" and (nested.group(2) == "" or nested.group(2).isdigit()):
            expand.append(value)  # curl's expand[]=x and the SDK's expand[0]=x
        elif nested and nested.group(1) == "metadata":
            metadata = {**(metadata or {}), nested.group(2): value}
        elif name == "metadata" and value == "":
            metadata = metadata or {}
        elif nested or name == "metadata":
            raise _unknown_parameter(nested.group(1) if nested else name)
        else:
            values[name] = value
    return Params(values, metadata, tuple(dict.fromkeys(path for path in expand if path)))


def reject_unknown(params: Params, allowed: AbstractSet[str], *, allow_metadata: bool = True) -> None:
    for name in params.values:
        if name not in allowed:
            raise _unknown_parameter(name)
    if params.metadata is not None and not allow_metadata:
        raise _unknown_parameter("metadata")


def _unknown_parameter(name: str) -> StripeApiError:
    return invalid_request(f"Received unknown parameter: {name}", code="parameter_unknown", param=name)


def required_str(params: Params, name: str) -> str:
    value = params.values.get(name)
    if not value:
        raise invalid_request(f"Missing required param: {name}.", code="parameter_missing", param=name)
    return value


def required_int(params: Params, name: str) -> int:
    value = optional_int(params, name)
    if value is None:
        raise invalid_request(f"Missing required param: {name}.", code="parameter_missing", param=name)
    return value


def optional_int(params: Params, name: str) -> int | None:
    value = params.values.get(name)
    if value is None or value == "":
        return None
    if not _INTEGER.match(value) or len(value) > 18:
        raise invalid_request(f"Invalid integer: {value}", code="parameter_invalid_integer", param=name)
    return int(value)


def page_params(params: Params) -> dict[str, Any]:
    """``limit``, ``starting_after`` and ``ending_before`` as every list route takes them."""
    limit = optional_int(params, "limit")
    return {
        "limit": 10 if limit is None else limit,
        "starting_after": params.values.get("starting_after") or None,
        "ending_before": params.values.get("ending_before") or None,
    }
