"""``make test``'s two workers keep each group together (``tests/conftest.py``): a module's tests, a shared session
fixture's, the browser tests. xdist carries the group as a ``@group`` suffix of the node id; when that suffix is
lost (a hook order, or pytest 9.2 with xdist 3.8: pytest-dev/pytest-xdist#1386) nothing fails, the groups are
only spread over both workers. This makes the loss fail."""

from __future__ import annotations

import pytest


def test_under_loadgroup_this_test_carries_its_modules_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not a worker of `pytest -n N --dist loadgroup` (make test)")
    assert request.node.nodeid.endswith("@tests/test_worker_groups.py")
