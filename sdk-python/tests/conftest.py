"""Shared fixtures: the conformance vectors of the repository."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "vectors"
WORKLOADS = ROOT.parent / "shared" / "workloads"


def load(folder: pathlib.Path) -> List[Dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@pytest.fixture(scope="session")
def verl_vectors() -> List[Dict[str, Any]]:
    return load(VECTORS / "verl")


@pytest.fixture(scope="session")
def stowplan_vectors() -> List[Dict[str, Any]]:
    return load(VECTORS)


@pytest.fixture(scope="session")
def roll_vectors() -> List[Dict[str, Any]]:
    return [v for v in load(VECTORS / "roll") if "kind" in v]
