"""The README's examples, run as written against a real `vigil serve` on the default model.

The code is read out of README.md at test time, so an example and its test cannot drift apart.
The only rewrite is the address: `127.0.0.1:8080`, `localhost:8080` and the second bench
target's `127.0.0.1:8000` become the test server's (the examples assume the default port,
which a test run cannot count on). `vigil` on PATH is the binary under test, and `$VIGIL_HOME`
holds the test model as the pulled default model, so `vigil generate` and `vigil pull` run
exactly as a user types them.

Not run: `cargo run`, `scripts/test.sh` (this suite is part of it), `vigil serve` lines (every
test here runs against `vigil serve`), and lines naming placeholder files (`m.gguf`,
`path/to/...`); `test_only_known_lines_are_skipped` keeps that list from growing unseen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, start_server, vigil_bin

README = REPO / "README.md"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_SKIPS = 9
SKIPPED = re.compile(r"^(cargo run|scripts/test\.sh|vigil serve|cargo install|python3 -m pip)|path/to/|\bm\.gguf\b")


def fenced(lang: str) -> list[str]:
    """The README's fenced code blocks of `lang`, in order."""
    text = README.read_text()
    return [m.group(1) for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)]


def commands(block: str) -> list[str]:
    """A shell block's commands: comment lines dropped, continuation lines and multi-line
    quoted JSON joined (a command ends on a line whose quotes are balanced and that does not
    end in a backslash)."""
    out, cur, quotes = [], "", 0
    for line in block.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur = f"{cur}\n{line}" if cur else line
        code = line
        for m in re.finditer(r"\s#", line):  # a trailing comment, outside quotes, may hold any text
            if (quotes + line[: m.start()].count("'")) % 2 == 0:
                code = line[: m.start()]
                break
        quotes += code.count("'")
        if quotes % 2 == 0 and not code.rstrip().endswith("\\"):
            out.append(cur)
            cur, quotes = "", 0
    assert not cur, f"unterminated command in README: {cur!r}"
    return out


def localize(text: str, url: str) -> str:
    hostport = url.removeprefix("http://")
    for old in ("127.0.0.1:8080", "localhost:8080", "127.0.0.1:8000"):
        text = text.replace(old, hostport)
    return text


@pytest.fixture(scope="module")
def server(gguf):
    s = start_server("readme", gguf, "--kv-memory", "256MiB")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory, gguf, server) -> dict:
    """PATH with `vigil` (the binary under test), `$VIGIL_HOME` with the default model."""
    root = tmp_path_factory.mktemp("readme")
    bindir, home = root / "bin", root / "home"
    (home / "models").mkdir(parents=True)
    bindir.mkdir()
    os.symlink(os.path.abspath(vigil_bin()), bindir / "vigil")
    os.symlink(os.path.abspath(gguf), home / "models" / DEFAULT_GGUF)
    e = dict(os.environ)
    e.update(
        PATH=f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}",
        VIGIL_HOME=str(home),
        LAYERSCALE_BASE_URL=server.url,
    )
    e.pop("VIGIL_API_KEY", None)
    return e


def run_sh(cmd: str, env: dict, cwd: Path, timeout: float, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], env=env, cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def test_readme_has_the_examples_this_file_checks():
    assert len(fenced("python")) == 3, "a Python example was added or removed: check it here"
    assert any("sessions.flash" in b for b in fenced("python"))
    assert any("/v1/sessions/plant/push" in b for b in fenced("sh"))


def test_only_known_lines_are_skipped():
    """A new line that this file would skip must be looked at (and this count raised)."""
    skipped = [c for b in fenced("sh") for c in commands(b) if SKIPPED.search(c)]
    assert len(skipped) == EXPECTED_SKIPS, skipped


@pytest.mark.parametrize("index", range(3))
def test_python_example_runs_and_does_what_its_comments_say(server, env, tmp_path, index):
    code = localize(fenced("python")[index], server.url)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    info = f"example {index}:\n{code}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-3000:]}"
    assert r.returncode == 0, info
    lines = r.stdout.splitlines()
    if "sessions.flash" in code:
        # print(g.text, g.flash, g.data_version): answered by the flash query, over the push;
        # print(g.text, cached_tokens): the data's KV was reused; then the first event.
        m = re.search(r"(True|False|None) (\d+)\n(.*) (\d+)\nconnected\n$", r.stdout, re.S)
        assert m, info
        assert m.group(1) == "True" and int(m.group(2)) >= 1, info
        assert int(m.group(4)) > 0, info
    elif "OpenAI(" in code:
        assert len(lines) >= 1 and lines[-1].split()[-1].isdigit(), info
    elif "health.check" in code:
        assert lines[0] == "True" and lines[-1].split()[-1] in ("end_turn", "max_tokens"), info


def curl_outputs(block: str, server, env, tmp_path) -> list[tuple[str, str]]:
    out = []
    for cmd in commands(block):
        if SKIPPED.search(cmd) or not cmd.startswith("curl"):
            continue
        local = localize(cmd, server.url)
        streams_forever = "/events" in cmd
        if streams_forever:
            local = local.replace("curl -sN", "curl -sN --max-time 3", 1)
        r = run_sh(local, env, tmp_path, timeout=120)
        ok = r.returncode == 0 or (streams_forever and r.returncode == 28)
        assert ok, f"{cmd}\n-> rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        out.append((cmd, r.stdout))
    return out


def test_curl_examples_answer_without_errors(server, env, tmp_path):
    seen = 0
    for block in fenced("sh"):
        for cmd, stdout in curl_outputs(block, server, env, tmp_path):
            seen += 1
            info = f"{cmd}\n-> {stdout[:2000]}"
            if re.search(r"\s-[a-zA-Z]*N\b", cmd):  # -N / -sN: a stream of SSE frames
                frames = [ln[5:].strip() for ln in stdout.splitlines() if ln.startswith("data:")]
                assert frames, info
                assert all(f == "[DONE]" or "error" not in json.loads(f) for f in frames), info
                continue
            body = json.loads(stdout)
            assert "error" not in body, info
            if "/sessions/plant/generate" in cmd:
                wanted = json.loads(cmd.split("-d '", 1)[1].rstrip("'")).get("min_data_version", 1)
                # After `"wait": true` (or with min_data_version) the answer is over the push.
                assert body["data_version"] >= wanted, info
            if "/sessions/plant/push" in cmd and '"wait": true' in cmd:
                assert body["resident"] is True and body["data_version"] >= 1, info
    assert seen >= 8, "the README's curl examples were not found"


@pytest.mark.timeout(900)
def test_command_line_examples_run(server, env, tmp_path):
    """`vigil generate`, `vigil pull` and the bench examples, as written (bench against the
    test server for both targets)."""
    ran = []
    for block in fenced("sh"):
        for cmd in commands(block):
            if SKIPPED.search(cmd) or not cmd.startswith("vigil "):
                continue
            local = localize(cmd, server.url)
            interactive = cmd.split("#")[0].strip() == "vigil generate --chat"
            t0 = time.monotonic()
            r = run_sh(local, env, tmp_path, timeout=600, stdin="Name a river.\n" if interactive else "")
            print(f"{time.monotonic() - t0:6.1f} s  {cmd.splitlines()[0][:100]}")
            assert r.returncode == 0, f"{cmd}\n-> rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
            if cmd.startswith("vigil generate"):
                assert r.stdout.strip(), f"{cmd}: no text"
            if cmd.startswith("vigil pull"):
                assert r.stdout.strip().endswith(DEFAULT_GGUF), r.stdout
            ran.append(cmd.split()[1])
    assert ran.count("generate") >= 3 and "pull" in ran and ran.count("bench") >= 3, ran
    results = sorted((tmp_path / "results").glob("*.json"))
    assert len(results) >= 2, results
    for f in results:
        run = json.loads(f.read_text())
        assert run["targets"] and all(t["points"] for t in run["targets"]), f
    assert (tmp_path / "report" / "report.md").is_file() and (tmp_path / "report" / "report.html").is_file()
    shutil.rmtree(tmp_path / "results")
