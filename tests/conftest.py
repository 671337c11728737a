"""Session fixtures shared by the test modules."""

import pytest

from tests import grouped_launches


@pytest.fixture(scope="session")
def launched_jobs(request, tmp_path_factory):
    """{job name: JobResult} of every job the collected test modules registered
    (tests/grouped_launches.py), all launched on first use."""
    modules = {item.module.__name__ for item in request.session.items}
    return grouped_launches.run_all(tmp_path_factory.mktemp("launches"), modules)
