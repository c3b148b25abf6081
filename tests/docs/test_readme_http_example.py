"""The README's HTTP example is a request the service answers as the text after it says (issue 27, item 2): its
curl body, taken from the README itself, sent to the real app and model."""

import json
import re
from pathlib import Path

import httpx

README = Path(__file__).parents[2] / "README.md"


def test_the_readmes_curl_example_gets_marginals_set_score_and_shaped_advantages(service):
    section = README.read_text().split("### The service over HTTP", 1)[1]
    (command,) = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)[:1]
    path = re.search(r"curl -s localhost:8000(/\S+) -H", command).group(1)  # the request, not the /ready probe
    body = json.loads(re.search(r"-d '(.*?)'", command, re.DOTALL).group(1))
    with httpx.Client(transport=service.transport(), base_url=service.URL) as http:
        answer = http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    (group,) = answer.json()["groups"]
    assert len(group["marginals"]) == 3 and "set_score" in group and len(group["advantages"]) == 3
