#!/usr/bin/env python3
"""Reference token ids for Vigil's tokenizer tests.

For every string of a shared corpus this records the ids (with and without special tokens)
and the decoded text, as produced by the reference implementations:
  * HF `tokenizers` for the tokenizer.json of Qwen3 and Llama 3.1
    ($VIGIL_TEST_TOKENIZERS/{qwen3,llama3_1}/tokenizer.json);
  * llama.cpp (llama-cpp-python, vocab only) for the vocabulary embedded in the SmolLM2 GGUF
    ($VIGIL_TEST_GGUF).
Writes tests/fixtures/tokenizer/{qwen3,llama3_1,smollm2_gguf}.json.

Usage: VIGIL_TEST_TOKENIZERS=dir VIGIL_TEST_GGUF=model.gguf make_tokenizer_fixtures.py
"""
import json
import os
import pathlib

CORPUS = [
    "",
    "Hello, world!",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "Hello\nworld\n\nnew paragraph\n",
    "\ttab\tseparated\tvalues\n\t\tindented",
    "mixed \t \n whitespace \r\n runs     ",
    "I'm sure you'll see they've said it's what we'd do, OK? DON'T SHOUT, IT'S LOUD",
    "1234567890 12 345 6789 3.14159 -42 1e10",
    "99999999999999999999999999999999999999",
    "Numbers: ١٢٣٤ (Arabic-Indic) ½ ² Ⅻ",
    "日本語のテキストです。漢字、ひらがな、カタカナ。",
    "中文测试：今天天气很好，我们去公园散步吧！",
    "한국어 문장입니다.",
    "Emoji: 😀👍🏽🎉 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "Combining marks: e\u0301 a\u0308 n\u0303 \u1e9b\u0323 Z\u0351\u036b\u0343\u036a",
    "Precomposed vs decomposed: é é Å Å",
    "RTL: שלום עולם and مرحبا بالعالم mixed with LTR",
    "Ελληνικά και русский текст",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() { let x: Vec<u32> = (0..10).map(|i| i * i).collect(); println!(\"{x:?}\"); }",
    "<html><body class=\"main\">&amp; &lt;tag&gt;</body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%smith%';",
    "$ echo \"hello\" | grep -E '^h.*o$' && ls -la ~/.config",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nHi<|eot_id|>",
    "text before<|endoftext|>text after",
    "not special: <|im_start |> <im_start> <|fake|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "https://example.com/path?query=value&other=1#fragment",
    "email@example.com, @handle, #hashtag",
    "ALLCAPS lowercase CamelCase snake_case kebab-case",
    "a" * 64,
    "  \n  \n",
    " ",
    "\n",
    "Ünïcödé ßtraße Ærøskøbing ÿ",
    "math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ → ∞ ≠ ≈",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "replacement char \ufffd stays",
    "quotes “smart” ‘single’ «guillemets» — dash – en",
]


def hf_fixture(tok_json):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_json))
    cases = []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_add_special": ids_special,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    return {"reference": "tokenizers " + __import__("tokenizers").__version__, "cases": cases}


def gguf_fixture(gguf_path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    cases = []
    for text in CORPUS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        ids_special = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_add_special": ids_special,
                "decoded": llm.detokenize(ids, special=True).decode("utf-8", errors="replace"),
                "decoded_skip_special": llm.detokenize(ids, special=False).decode("utf-8", errors="replace"),
            }
        )
    return {"reference": "llama-cpp-python " + llama_cpp.__version__, "cases": cases}


def main():
    out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = pathlib.Path(os.environ["VIGIL_TEST_TOKENIZERS"])
    fixtures = {
        "qwen3": hf_fixture(tok_dir / "qwen3" / "tokenizer.json"),
        "llama3_1": hf_fixture(tok_dir / "llama3_1" / "tokenizer.json"),
        "smollm2_gguf": gguf_fixture(os.environ["VIGIL_TEST_GGUF"]),
    }
    for name, data in fixtures.items():
        with open(out / f"{name}.json", "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
