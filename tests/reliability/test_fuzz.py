"""Schemathesis against the running server's own /openapi.json: no 5xx, and every response (errors too)
matches the documented schema. Quick form here (25 examples per operation, at least 150 cases); `make soak`
sets SETPO_FUZZ_EXAMPLES=500 and SETPO_FUZZ_MIN_CASES=1000, the issue's floor."""

import os
import re
import subprocess
import sys
from pathlib import Path

from setpo_server.local import LocalServer

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"


def test_generated_requests_never_get_a_5xx_and_answers_match_the_schema():
    examples = os.environ.get("SETPO_FUZZ_EXAMPLES", "25")
    min_cases = int(os.environ.get("SETPO_FUZZ_MIN_CASES", "150"))
    schemathesis = Path(sys.executable).with_name("schemathesis")
    with LocalServer() as server:
        run = subprocess.run(
            [
                str(schemathesis),
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                CHECKS,
                "-n",
                examples,
                "--phases",
                "coverage,fuzzing",
                "--no-color",
                "--seed",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    assert run.returncode == 0, run.stdout[-4000:]
    generated, passed = map(int, re.search(r"(\d+) generated, (\d+) passed", run.stdout).groups())
    print(f"schemathesis: {generated} generated, {passed} passed")
    assert generated == passed >= min_cases
