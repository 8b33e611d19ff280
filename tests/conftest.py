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
