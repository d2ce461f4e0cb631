"""Test settings shared by every package's tests (pytest finds this file above all the test folders).

Hypothesis: no per-example deadline (CI machines have 2 busy cores; timing is not what property tests check), and
a derandomized profile under CI so a failure reproduces. Select another with ``--hypothesis-profile=NAME``.
"""
import os

try:
  from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a test dependency; without it only the tests that import it fail
  pass
else:
  settings.register_profile("dev", deadline=None)
  settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                            suppress_health_check=[HealthCheck.too_slow])
  settings.load_profile("ci" if os.environ.get("CI") else "dev")
