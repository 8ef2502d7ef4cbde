"""CPU-seconds per test: what `make test`'s budget is counted in. The cores are busy the whole
run, so a test's wall time says as much about what ran beside it as about its own cost.

A test's CPU is its worker process's and that of the subprocesses it waited for (the imgbuild
CLI, payload runs, uv, git: getrusage's RUSAGE_CHILDREN), from the start of its setup to the
end of its teardown; a module or session fixture counts for the first test that asks for it.
The Docker Engine's, containerd's, BuildKit's and the registry's are not in it (daemons, not
children), so a docker test costs the machine more than it says here.

After the run the summary gives the total, the docker tests' part and the tests that cost most
(`CPU-seconds by test`); each test's report carries a `cpu_s` property, which JUnit XML keeps
(bench/suite_bench.py reads it). Loaded by tests/conftest.py.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import pytest

CPU_PROPERTY = "cpu_s"
_START = pytest.StashKey[float]()


def cpu_now() -> float:
    """This process's CPU-seconds so far, with its waited-for children's."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class Spent:
    test: str
    seconds: float
    docker: bool


def summary(spent: list[Spent], top: int = 20) -> list[str]:
    """The lines printed after the run: the total, the docker tests' and the other tests'
    parts, then the `top` tests that cost most, most first."""
    if not spent:
        return []
    total = sum(s.seconds for s in spent)
    docker = sum(s.seconds for s in spent if s.docker)
    lines = [f"{total:.0f} CPU-seconds in {len(spent)} tests: docker tests {docker:.0f} "
             f"(the Engine's and the registry's own not counted), the others "
             f"{total - docker:.0f}"]
    for s in sorted(spent, key=lambda s: (-s.seconds, s.test))[:top]:
        lines.append(f"{s.seconds:8.1f}  {s.test}" + ("  [docker]" if s.docker else ""))
    return lines


class CpuRecord:
    """The plugin: registered once per process by tests/conftest.py (`register`)."""

    NAME = "imgbuild-cpu-record"

    def __init__(self) -> None:
        self.spent: dict[str, Spent] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        item.stash[_START] = cpu_now()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if call.when == "teardown" and _START in item.stash:
            report.user_properties.append((CPU_PROPERTY,
                                           round(cpu_now() - item.stash[_START], 2)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """On the controller (and in a run without workers): each test's figure, as its
        teardown report brings it."""
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == CPU_PROPERTY:
                self.spent[report.nodeid] = Spent(report.nodeid, float(value),
                                                  "docker" in report.keywords)


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuRecord(), CpuRecord.NAME)


def lines(config: pytest.Config) -> list[str]:
    plugin = config.pluginmanager.get_plugin(CpuRecord.NAME)
    return summary(list(plugin.spent.values())) if plugin is not None else []
