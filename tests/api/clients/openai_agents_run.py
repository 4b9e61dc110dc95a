"""Runs openai-agents (its own venv: its websockets pin conflicts with layerscale's) against a
Vigil server and prints one JSON object with what each run produced; `test_openai_agents.py`
asserts on it. Usage: python openai_agents_run.py BASE_URL"""

from __future__ import annotations

import asyncio
import json
import sys

import pydantic
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_default_openai_api, set_default_openai_client, set_tracing_disabled)
from openai import AsyncOpenAI


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    species: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=30)


CALLS: list[str] = []
# Sampled runs are seeded: the same output every run, so a failure can be replayed.
SEED = 7


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    CALLS.append(city)
    return f"sunny, 21 C in {city}"


async def main(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    model = (await client.models.list()).data[0].id
    set_tracing_disabled(True)
    # The default model provider: a model named by string runs on OpenAI's Responses API.
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")
    settings = ModelSettings(temperature=0, max_tokens=60)
    out: dict = {"model": model}

    plain = Agent(name="greeter", instructions="You are brief.", model=model, model_settings=settings)
    r = await Runner.run(plain, "Say hello.")
    out["plain"] = {"final_output": r.final_output, "response_ids": [x.response_id for x in r.raw_responses]}

    streamed = Runner.run_streamed(plain, "Say hello.")
    kinds = []
    async for ev in streamed.stream_events():
        if ev.type == "raw_response_event":
            kinds.append(ev.data.type)
    out["streamed"] = {"final_output": streamed.final_output, "events": kinds}

    typed = Agent(name="pets", instructions="Describe a pet.", model=model, output_type=Pet,
                  model_settings=ModelSettings(temperature=0.7, max_tokens=80, extra_body={"seed": SEED}))
    r = await Runner.run(typed, "Describe a pet as JSON.")
    out["typed"] = {"is_pet": isinstance(r.final_output, Pet),
                    "final_output": r.final_output.model_dump() if isinstance(r.final_output, Pet) else repr(r.final_output)}

    tools = Agent(name="weather", instructions="Use the tool.", model=model, tools=[get_weather],
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(temperature=0, max_tokens=80, tool_choice="required"))
    r = await Runner.run(tools, "What is the weather in Paris?")
    out["tools"] = {"final_output": r.final_output, "calls": CALLS}

    # The chat-completions model on the same server, for the output_type path there too.
    chat_typed = Agent(name="pets-chat", model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                       output_type=Pet, model_settings=ModelSettings(temperature=0.7, max_tokens=80, extra_body={"seed": SEED}))
    r = await Runner.run(chat_typed, "Describe a pet as JSON.")
    out["chat_typed"] = {"is_pet": isinstance(r.final_output, Pet)}
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
