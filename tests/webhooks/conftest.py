"""Fixtures for the webhook tests: a secret, and receivers that are always shut down."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .receiver import Receiver


@pytest.fixture
def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver(secret: str) -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(**kwargs: Any) -> Receiver:
        r = Receiver(secret, **kwargs)
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()
