"""openai-agents 0.24 against Vigil: an `Agent` on its default model (OpenAI's Responses API,
plain and streamed), `output_type` (structured output through `text.format`), a function tool
round trip, and `output_type` on its chat-completions model. The client lives in a venv of its
own (`VIGIL_TEST_AGENTS_PYTHON`, made by scripts/setup_python.sh): its websockets pin conflicts
with layerscale's, so `clients/openai_agents_run.py` runs there and prints what each run made."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import start_server


@pytest.fixture(scope="module")
def smol(gguf):
    """A server of this module's own: the Responses model stores its responses, whose chains
    hold KV that the shared server's tests expect free."""
    server = start_server("agents", gguf, "--kv-memory", "256MiB")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def agents_run(smol) -> dict:
    python = os.environ.get("VIGIL_TEST_AGENTS_PYTHON")
    assert python, "VIGIL_TEST_AGENTS_PYTHON is unset: run scripts/setup_python.sh (it makes .cache/venv-agents)"
    script = Path(__file__).parent / "clients" / "openai_agents_run.py"
    # The SDK redacts the model's output from its errors by default; a failure must show it.
    env = dict(os.environ, OPENAI_AGENTS_DONT_LOG_MODEL_DATA="0")
    p = subprocess.run([python, str(script), smol.v1], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_default_agent_runs_on_the_responses_api(agents_run):
    plain = agents_run["plain"]
    assert isinstance(plain["final_output"], str) and plain["final_output"].strip()
    assert all(rid.startswith("resp") for rid in plain["response_ids"])


def test_streamed_run_sees_the_responses_events(agents_run):
    s = agents_run["streamed"]
    assert s["events"][0] == "response.created" and s["events"][-1] == "response.completed"
    assert "response.output_text.delta" in s["events"]
    # Greedy: the streamed run says what the plain run said.
    assert s["final_output"] == agents_run["plain"]["final_output"]


def test_output_type_gives_a_validated_object(agents_run):
    assert agents_run["typed"]["is_pet"], agents_run["typed"]
    assert agents_run["chat_typed"]["is_pet"]


def test_a_function_tool_is_called_with_schema_valid_arguments(agents_run):
    tools = agents_run["tools"]
    assert len(tools["calls"]) == 1 and isinstance(tools["calls"][0], str) and tools["calls"][0]
    assert tools["final_output"] == f"sunny, 21 C in {tools['calls'][0]}"
