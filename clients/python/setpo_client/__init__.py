"""setpo-client: call the SetPO diversity service from any RL framework.

from setpo_client import SetpoClient
with SetpoClient("http://127.0.0.1:8000") as setpo:
    result = setpo.diversity([{"texts": responses, "rewards": rewards}], weight=0.05)
    shaped = result.groups[0].advantages
"""

from setpo_client.client import DEFAULT_URL, AsyncSetpoClient, SetpoClient
from setpo_client.errors import SetpoAPIError, SetpoConnectionError, SetpoError, SetpoTimeoutError
from setpo_client.types import (
    DiversityResponse,
    DiversityUsage,
    Embedding,
    EmbeddingsResponse,
    EmbeddingsUsage,
    Group,
    GroupResult,
    Info,
    Limits,
    Model,
    ModelList,
)

__version__ = "0.1.0"
__all__ = [
    "DEFAULT_URL",
    "AsyncSetpoClient",
    "DiversityResponse",
    "DiversityUsage",
    "Embedding",
    "EmbeddingsResponse",
    "EmbeddingsUsage",
    "Group",
    "GroupResult",
    "Info",
    "Limits",
    "Model",
    "ModelList",
    "SetpoAPIError",
    "SetpoClient",
    "SetpoConnectionError",
    "SetpoError",
    "SetpoTimeoutError",
]
