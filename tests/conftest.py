"""The grouped launches of the multi-process test jobs (tests/grouped_launches.py): started in
the background when the session starts, their results read by the tests that use the fixture
`launched_jobs`, which run last."""

import pytest

from tests import grouped_launches


def _uses_launches(item):
    return "launched_jobs" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items):
    """The tests that read the launches' results go last (in their order), so that the launches
    run while the others do."""
    items.sort(key=_uses_launches)


@pytest.fixture(scope="session", autouse=True)
def _launches(request, tmp_path_factory):
    """The launches of the jobs of every module with a selected test that reads them, running
    in the background from the session's start; any still running at its end is killed."""
    modules = {item.module.__name__ for item in request.session.items if _uses_launches(item)}
    launches = grouped_launches.InBackground(tmp_path_factory.mktemp("launches"), modules)
    yield launches
    launches.stop()


@pytest.fixture(scope="session")
def launched_jobs(_launches):
    """{job name: JobResult} of every job (tests/grouped_launches.py), once all have ended."""
    return _launches.result()
