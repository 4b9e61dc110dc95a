"""langchain-openai's `with_structured_output` against `vigil serve` on SmolLM2, all three
methods: `json_schema` (`response_format` with the model's schema), `json_mode`
(`response_format: json_object`) and `function_calling` (a forced call of a tool made from the
schema; SmolLM2's template has no tool format, so this runs through the generic tool prompt
with the arguments constrained by the tool's schema)."""

from __future__ import annotations

import pydantic
import pytest
from langchain_openai import ChatOpenAI


class City(pydantic.BaseModel):
    """A city and where it is."""

    name: str = pydantic.Field(max_length=16)
    country: str = pydantic.Field(max_length=16)
    coastal: bool


@pytest.fixture(scope="module")
def llm(smol):
    return ChatOpenAI(base_url=smol.v1, api_key="unused", model="m", temperature=0, max_tokens=80,
                      max_retries=0, timeout=120)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_returns_the_model(llm, method):
    out = llm.with_structured_output(City, method=method).invoke("Describe Lisbon, Portugal.")
    assert isinstance(out, City), out
    assert out.name and out.country


def test_with_structured_output_json_mode_returns_json(llm):
    schema = {"title": "city", "type": "object", "properties": {"name": {"type": "string"}}}
    out = llm.with_structured_output(schema, method="json_mode").invoke(
        "Answer in JSON with a `name` field: name a city in Portugal."
    )
    assert isinstance(out, dict), out
