"""`--task jsonl:FILE`: questions from a JSON-lines file, rewarded by exact match of the last \\boxed{...} answer.

File format: one JSON object per line with a string field `prompt` (the question, as the user would ask it) and a
field `answer` (the reference: a string, or a number, which is turned into a string). Blank lines are skipped.
Other field names: `jsonl:FILE:QUESTION_KEY:ANSWER_KEY`, e.g. `jsonl:gsm8k.jsonl:question:solution`.
A bad line (not UTF-8, not JSON, a missing or mistyped field) is refused naming the file and line, and
`JsonlTask.check_lengths` names the first line whose prompt the model's positions cannot hold.

Prompts are wrapped in the checkpoint tokenizer's ChatML template (`r3.scale.hf.Tokenizer.encode_chat`). The reward is
1.0 when the content of the response's last `\\boxed{...}` (nested braces allowed) equals the reference with all
whitespace removed, else 0.0; a reference that itself contains \\boxed{...} is compared by its boxed content.
A response whose last \\boxed is never closed (cut off by the length limit) scores 0.

Same interface as the toy tasks (`r3.tasks.tasks.Task`): `sample(n, generator, split)` → examples with `.prompt` token
ids, `reward(response_ids, example)` → (reward, info), `max_new_tokens`, `name`.
"""
import json
import math
import os
import re
from dataclasses import dataclass

import torch

from r3.errors import InputError, MissingInputError
from r3.scale.hf import Tokenizer
from r3.tasks.tasks import check_split, prompt_split


@dataclass(frozen=True)
class JsonlExample:
    prompt: list[int]  # chat-formatted token ids
    question: str
    answer: str  # the reference, as written in the file


def last_boxed(text: str) -> str | None:
    r"""Content of the last \boxed{...} in `text` (nested braces kept), or of `\boxed x`; None if none or unclosed."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = start + len("\\boxed")
    if text[i:i + 1] == " ":  # `\boxed 5`: up to the next whitespace or `$`
        m = re.match(r" +([^\s$]+)", text[i:])
        return m[1] if m else None
    if text[i:i + 1] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def normalize(answer: str) -> str:
    return re.sub(r"\s+", "", answer)


def boxed_reward(response_text: str, reference: str) -> tuple[float, dict]:
    """1.0 if the last \\boxed content equals the reference (whitespace removed), else 0.0; info says why."""
    got = last_boxed(response_text)
    ref = last_boxed(reference) if "\\boxed" in reference else reference
    exact = got is not None and ref is not None and normalize(got) == normalize(ref)
    return float(exact), dict(exact=exact, has_boxed=got is not None, extracted=got)


def read_qa_lines(path: str, prompt_key: str = "prompt", answer_key: str = "answer") -> list[tuple[int, str, str]]:
    """(line number, question, answer) per example; a bad line (not UTF-8, not JSON, missing or mistyped field)
    raises ValueError naming the file, line and field."""
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{n}: not UTF-8 text (byte {e.start} of the line: {e.reason})") from e
            if not line.strip():
                continue
            rows.append((n, *_parse_line(line, f"{path}:{n}", prompt_key, answer_key)))
    if not rows:
        raise InputError(f"{path}: no examples")
    return rows


def _parse_line(line: str, where: str, prompt_key: str, answer_key: str) -> tuple[str, str]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in (prompt_key, answer_key):
        if key not in obj:
            raise InputError(f"{where}: missing field {key!r} (fields: {sorted(obj)})")
    q, a = obj[prompt_key], obj[answer_key]
    if not isinstance(q, str):
        raise InputError(f"{where}: field {prompt_key!r} must be a string, got {type(q).__name__}")
    if isinstance(a, bool) or not isinstance(a, (str, int, float)):
        raise InputError(f"{where}: field {answer_key!r} must be a string or number, got {type(a).__name__}")
    if isinstance(a, float) and not math.isfinite(a):
        raise InputError(f"{where}: field {answer_key!r} is {a}, not a reference answer")
    return q, str(a)


class JsonlTask:
    name = "jsonl"

    def __init__(self, path: str, tokenizer: Tokenizer, *, prompt_key: str = "prompt", answer_key: str = "answer",
                 max_new_tokens: int = 1024):
        self.path, self.tokenizer, self.max_new_tokens = path, tokenizer, max_new_tokens
        lines = read_qa_lines(path, prompt_key, answer_key)
        self.line_numbers = [n for n, _, _ in lines]
        self.rows = [(q, a) for _, q, a in lines]

    def __len__(self) -> int:
        return len(self.rows)

    def example(self, i: int) -> JsonlExample:
        q, a = self.rows[i]
        return JsonlExample(self.tokenizer.encode_chat(q), q, a)

    def split_of(self, ex: JsonlExample) -> str:
        return prompt_split(ex.question)

    def split_rows(self, split: str | None) -> list[int]:
        """Row indices of a split (`r3.tasks.tasks.prompt_split` of the question text); None = every row."""
        check_split(split)
        return [i for i, (q, _) in enumerate(self.rows) if split is None or prompt_split(q) == split]

    def sample(self, n: int, g: torch.Generator, split: str | None = None) -> list[JsonlExample]:
        """n examples drawn uniformly with replacement (the generator fixes the order, as for the toy tasks), from
        the rows of `split` (None: all rows, the earlier stream bit for bit)."""
        rows = self.split_rows(split) if split is not None else range(len(self.rows))
        if not rows:
            raise InputError(f"{self.path}: no {split!r} rows ({len(self.rows)} rows in all)")
        return [self.example(rows[i]) for i in torch.randint(0, len(rows), (n,), generator=g).tolist()]

    def check_lengths(self, max_positions: int, max_new_tokens: int | None = None) -> int:
        """Raise ValueError naming the first line whose chat-formatted prompt plus `max_new_tokens` (default: the
        task's) does not fit `max_positions`, the model's positions; else return the longest prompt's length."""
        N = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        lengths = [len(self.example(i).prompt) for i in range(len(self.rows))]
        over = [i for i, p in enumerate(lengths) if p + N > max_positions]  # the engine's rule (Engine.generate)
        if over:
            i = over[0]
            raise InputError(f"{self.path}:{self.line_numbers[i]}: the prompt is {lengths[i]} tokens; with "
                             f"{N} new tokens the model would need {lengths[i] + N} positions, it has "
                             f"{max_positions} ({len(over)} line(s) too long)")
        return max(lengths)

    def reward(self, response: list[int], ex: JsonlExample) -> tuple[float, dict]:
        """response: generated ids, EOS included if produced; special tokens are dropped before matching."""
        return boxed_reward(self.tokenizer.decode(response), ex.answer)


def make_jsonl_task(spec: str, tokenizer: Tokenizer, max_new_tokens: int = 1024) -> JsonlTask:
    """'jsonl:FILE' or 'jsonl:FILE:QUESTION_KEY:ANSWER_KEY'."""
    if not spec.startswith("jsonl:"):
        raise InputError(f"not a jsonl task spec: {spec!r} (want jsonl:FILE or jsonl:FILE:QUESTION_KEY:ANSWER_KEY)")
    rest = spec[len("jsonl:"):]
    path, keys = rest, ("prompt", "answer")
    parts = rest.rsplit(":", 2)
    if not os.path.exists(rest) and len(parts) == 3:
        path, keys = parts[0], (parts[1], parts[2])
    if not os.path.exists(path):
        raise MissingInputError(f"task file {path!r} (from {spec!r}) does not exist")
    return JsonlTask(path, tokenizer, prompt_key=keys[0], answer_key=keys[1], max_new_tokens=max_new_tokens)
