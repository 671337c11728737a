"""The grouped launches of the multi-process test jobs (tests/grouped_launches.py): started in
the background when the session starts, their results read by the tests that use the fixture
`launched_jobs`, which run last.

Under pytest-xdist (`make test` runs `pytest -n 2 --dist loadfile`) the first worker to start
a test runs the launches; another worker that reads them waits for their outcome file. The
worker running them waits for their end before its session ends, since the other may still
read them."""

import os

import pytest

from tests import grouped_launches


def _uses_launches(item):
    return "launched_jobs" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items):
    """The modules with tests that read the launches' results go after every other module, and
    those tests last (otherwise in their order), so that the launches run while the others do:
    under `--dist loadfile` a worker takes a whole module, and one that took such a module early
    would wait for the launches with other modules still to run (`make test` keeps this order
    with `--no-loadscope-reorder`)."""
    waiting = {_file_of(item) for item in items if _uses_launches(item)}
    items.sort(key=lambda item: (_file_of(item) in waiting, _uses_launches(item)))


def _file_of(item):
    """The test file of `item`, as `--dist loadfile` groups tests."""
    return item.nodeid.split("::")[0]


@pytest.fixture(scope="session", autouse=True)
def _launches(request, tmp_path_factory):
    """The launches of the jobs of every module with a selected test that reads them, running
    in the background from the session's start (in one xdist worker); any still running at the
    end of a session without xdist is killed."""
    modules = {item.module.__name__ for item in request.session.items if _uses_launches(item)}
    in_a_worker = hasattr(request.config, "workerinput")
    base = tmp_path_factory.getbasetemp()
    root = base.parent if in_a_worker else base  # the workers' shared directory
    directory = root / "launches"
    try:
        os.mkdir(root / "launches.claimed")  # atomic: one worker runs the launches
    except FileExistsError:
        yield grouped_launches.InAnotherWorker(directory)
        return
    directory.mkdir()
    launches = grouped_launches.InBackground(directory, modules)
    yield launches
    if in_a_worker:
        launches.result()
    else:
        launches.stop()


@pytest.fixture(scope="session")
def launched_jobs(_launches):
    """{job name: JobResult} of every job (tests/grouped_launches.py), once all have ended."""
    return _launches.result()
