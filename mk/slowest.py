"""Print the slowest tests of a `make test` run, over every suite: python mk/slowest.py N out/junit/*.xml.

Each suite writes pytest's JUnit XML (--junitxml, the Makefile's SUITE_REPORT); a test's time there is its setup,
call and teardown together, as in --durations. Suites that did not run this time have no file (a glob
that matched nothing arrives as itself, and is skipped).
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

count, *reports = sys.argv[1:]
times = []
for report in filter(lambda path: Path(path).is_file(), reports):
    suite = Path(report).stem
    for case in ET.parse(report).iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        times.append((float(case.get("time", 0)), suite, test))
print(f"slowest {count} tests of this run (setup + call + teardown):")
for seconds, suite, test in sorted(times, reverse=True)[: int(count)]:
    print(f"{seconds:8.2f} s  {suite}  {test}")
