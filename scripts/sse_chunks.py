"""The chunks of a streamed OpenAI-style completion, parsed: shared by the benchmark scripts."""

from __future__ import annotations

import json
from typing import Iterator

import httpx


def stream_chunks(url: str, body: dict, timeout: float = 600) -> Iterator[dict]:
    """POST `body` to `url` with streaming and yield each `data:` chunk until `[DONE]`."""
    with httpx.stream("POST", url, json=body, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            yield json.loads(line[6:])
