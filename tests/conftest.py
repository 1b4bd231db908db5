import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parent

# Property tests judge what the code does, never how long one example takes: a deadline (200 ms by
# default) or a too-slow health check fails a test on a loaded machine, which is a flake.
settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("suite")

# Tests import their helpers (support.py) by plain name.
sys.path.insert(0, str(TESTS))


def _installed_package() -> str | None:
    """Why the suite cannot test what pip installed, or None when it can.

    The library lives in src/, which nothing puts on sys.path: ``import wallaroo_proto`` and every
    ``wallaroo-proto`` a test starts find the package pip installed (a wheel, or an editable
    install that a developer chose), never a checkout that happens to be the working directory.
    """
    try:
        dist = importlib.metadata.distribution("wallaroo-proto")
    except importlib.metadata.PackageNotFoundError:
        return "wallaroo-proto is not installed: pip install '.[all]' (or pip install -e '.[all]' to edit)"
    import wallaroo_proto

    loaded = Path(wallaroo_proto.__file__).resolve()
    direct_url = dist.read_text("direct_url.json")
    editable = bool(direct_url) and json.loads(direct_url).get("dir_info", {}).get("editable", False)
    expected = Path(dist.locate_file("wallaroo_proto/__init__.py")).resolve()
    if not editable and loaded != expected:
        return f"wallaroo_proto is imported from {loaded.parent}, not the installed {expected.parent}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    problem = _installed_package()
    if problem:
        pytest.exit(problem, returncode=2)
    _watch_process_starts()


# --- the e2e tier -----------------------------------------------------------------------------
# A test that starts a process, a JVM or a real peer is marked ``e2e`` here, by reading what its
# code (and the test helpers and fixtures it calls) names; ``-m "not e2e"`` is the quick tier. A
# test that starts a process all the same (through library code, say) fails and says so, so the
# quick tier cannot drift into slow tests unseen.

#: Names whose use means a process: the helpers that run the CLI, subprocess, Spark's JVM.
STARTS_A_PROCESS = frozenset(
    {"run_cli", "Server", "Popen", "subprocess", "create_subprocess_exec", "create_subprocess_shell"}
    | {"pyspark", "SparkSession", "spark", "replayed_everything", "as_foreground"}
)


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _in_tests(thing) -> bool:
    """Defined in the tests' own files: helpers worth reading, unlike the library's or pytest's."""
    if not (inspect.ismodule(thing) or inspect.isclass(thing) or inspect.isfunction(thing)):
        return False
    try:
        return inspect.getfile(thing).startswith(str(TESTS))
    except TypeError:  # built in
        return False


def _names_reached(function, seen: set) -> set[str]:
    """The global and attribute names ``function`` uses, following the tests' own helpers."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return set()
    seen.add(code)
    names: set[str] = set()
    for each in _code_objects(code):
        names.update(each.co_names)
        names.update(each.co_varnames)  # a fixture requested by argument
    module_globals = getattr(function, "__globals__", {})
    used = frozenset(names)
    for name in used:
        helper = module_globals.get(name)
        if not _in_tests(helper):
            continue
        if inspect.ismodule(helper):  # support.run_cli and the like
            reached = [getattr(helper, attr, None) for attr in used]
            reached = [each for each in reached if inspect.isfunction(each)]
        elif inspect.isclass(helper):
            reached = [method for method in vars(helper).values() if inspect.isfunction(method)]
        else:
            reached = [helper]
        for each in reached:
            names |= _names_reached(each, seen)
    return names


def _starts_a_process(item: pytest.Function) -> bool:
    """Whether the test, or a fixture or helper of the tests' own that it uses, names a process."""
    seen: set = set()
    names = _names_reached(item.function, seen)
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        for definition in definitions:
            if _in_tests(definition.func):
                names |= _names_reached(definition.func, seen)
    return bool(names & STARTS_A_PROCESS)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker more than the cores. About half of a worker's time is spent waiting
    on peers, JVMs and answer deadlines, so a third worker on two cores keeps them busy
    (BENCHMARKS.md: 11:40 against 13:31 for the full suite)."""
    return (os.cpu_count() or 1) + 1


#: The modules that take longest (BENCHMARKS.md), sent to pytest-xdist's workers first (with
#: --no-loadscope-reorder it keeps this order, a module a worker at a time), so that neither worker
#: ends on one of them while the other sits idle. The standalone cluster's module comes first: it
#: also makes the one shared spark-replay that the others read.
LONGEST_FIRST = (
    "test_spark_cluster",
    "test_kinesis_real_daemon",
    "test_spark_replay",
    "test_readme_examples",
    "test_spark_s3",
    "test_conformance",
    "test_proxy_dcp_java",
    "test_conformance_tremor",
    "test_interop_ambrosia_node",
    "test_fuzz_wallaroo",
    "test_fuzz_ambrosia",
    "test_fuzz_wallaroo_peers",
    "test_fuzz_kinesis",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(getattr(item.module, "__name__", ""), len(rank)))  # stable
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if not item.get_closest_marker("e2e") and _starts_a_process(item):
            item.add_marker(pytest.mark.e2e)


_starts = {"count": 0}
_STARTS_BEFORE = pytest.StashKey[int]()


def _watch_process_starts() -> None:
    """Count every process the test process starts: subprocess (asyncio's too) and fork."""
    popen_init = subprocess.Popen.__init__

    def counted_init(self, *args, **kwargs):
        _starts["count"] += 1
        popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = counted_init
    os.register_at_fork(before=lambda: _starts.__setitem__("count", _starts["count"] + 1))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTS_BEFORE] = _starts["count"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    started = _starts["count"] != item.stash.get(_STARTS_BEFORE, _starts["count"])
    if call.when == "teardown" and started and report.passed and not item.get_closest_marker("e2e"):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} starts a process but is not marked e2e: mark it (pytest.mark.e2e) so that "
            "the quick tier (-m 'not e2e') stays quick"
        )
    return report


@pytest.fixture(scope="session")
def replayed_everything(tmp_path_factory, worker_id):
    """One spark-replay over every protocol's captures for the whole run (see replay_everything.py)."""
    pytest.importorskip("pyspark")
    from replay_everything import shared_replay

    run_dir = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # each worker's folder is in the run's own
        run_dir = run_dir.parent
    return shared_replay(run_dir / "replay-everything")
