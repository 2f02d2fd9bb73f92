"""Fixtures for the chart tests: each ci scenario's render and values (see chart_render)."""

from __future__ import annotations

import pytest

from .chart_render import SCENARIOS, Rendered, render_scenario, scenario_values


@pytest.fixture(params=SCENARIOS)
def scenario(request) -> str:
    return request.param


@pytest.fixture
def rendered(scenario) -> Rendered:
    return render_scenario(scenario)


@pytest.fixture
def values(scenario) -> dict:
    return scenario_values(scenario)
