"""litellm's `response_format` (a pydantic model, sent as a JSON schema) against `vigil serve`
on SmolLM2 through litellm's OpenAI-compatible provider: the content parses as the model."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: its bundled copy

import litellm  # noqa: E402
import pydantic  # noqa: E402


class Verdict(pydantic.BaseModel):
    answer: str = pydantic.Field(max_length=8)
    confident: bool


def test_litellm_response_format_parses(smol):
    r = litellm.completion(
        model="openai/m", api_base=smol.v1, api_key="unused", temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "Is the sea salty? Answer as JSON."}],
        response_format=Verdict,
    )
    assert r.choices[0].finish_reason == "stop"
    Verdict.model_validate_json(r.choices[0].message.content)
