"""Hypothesis profiles: ``ci`` (default; derandomized and bounded so the CPU suite stays
well under 15 minutes on 2 cores) and ``nightly`` (≥ 20,000 examples per property).

Select with ``HYPOTHESIS_PROFILE=nightly`` or ``pytest --hypothesis-profile=nightly``
(``dosa fuzz --profile nightly`` does this).
"""

import os

from hypothesis import HealthCheck, settings

_common = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("ci", derandomize=True, max_examples=60, print_blob=True, **_common)
settings.register_profile("dev", max_examples=200, print_blob=True, **_common)
settings.register_profile("nightly", max_examples=20000, print_blob=True, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _screening_route(request, monkeypatch):
    """GPU tests of the screening pipeline run DoSA's stages: the route choice
    (dosa_cupy/route.py, docs/method.md §9 "Route choice") would send their small chunks to
    the dense route before any screen ran, and each test would then check the dense route
    against itself.  So the default route is "dosa" in tests marked ``gpu``; tests of the
    route choice are marked ``route_choice`` and see the library's default ("auto")."""
    if request.node.get_closest_marker("gpu") and not request.node.get_closest_marker(
        "route_choice"
    ):
        from dosa_cupy import options  # imports without CuPy

        monkeypatch.setitem(options.OPTIONS, "route", "dosa")


def pytest_collection_modifyitems(config, items):
    """Mark every hypothesis test ``property`` (pyproject.toml registers the marker): ``dosa
    fuzz`` runs ``-m property``, and a new ``@given`` test joins it without a decorator."""
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
