"""The proxy tests' fake model server: the fake model's testing kit under the names these tests use.

The server itself is :mod:`router.tools.fake_model` (one application for the CLI and for tests);
:func:`running` starts it in the test's event loop, see :mod:`router.tools.fake_model.testing`.
"""

from router.tools.fake_model.testing import FakeModel as FakeUpstream
from router.tools.fake_model.testing import running, sse_events

__all__ = ["FakeUpstream", "running", "sse_events"]
