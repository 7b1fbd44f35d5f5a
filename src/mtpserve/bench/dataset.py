"""The prompts a benchmark sends: a built-in prompt set or a JSONL file.

JSONL format: one JSON object a line (blank lines skipped), each with either ``"prompt"`` (a
string: one user message for chat, the raw text for completions) or ``"messages"`` (an OpenAI
chat list, chat endpoint only).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpserve.bench.prompts import as_messages, prompt_set
from mtpserve.jsonl import read_objects


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt: ``text`` (a plain prompt) or ``messages`` (a chat list); exactly one is set."""

    text: str | None = None
    messages: tuple[dict, ...] | None = None

    def chat_messages(self) -> list[dict]:
        """The chat list: ``messages``, or ``text`` as one user message."""
        return list(self.messages) if self.messages is not None else as_messages(self.text)

    def completion_prompt(self) -> str:
        """The completion prompt; raises ``ValueError`` for a chat-list prompt."""
        if self.text is None:
            raise ValueError("a prompt given as \"messages\" needs --endpoint chat")
        return self.text


def builtin_prompts(name: str) -> list[BenchPrompt]:
    """The built-in set ``name``; raises ``ValueError`` naming the known sets."""
    try:
        return [BenchPrompt(text=t) for t in prompt_set(name)]
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def load_jsonl(path: str) -> list[BenchPrompt]:
    """Read a JSONL prompt file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not a JSON object with a string ``prompt`` or a non-empty
            ``messages`` list (the message names the line), or a file without prompts.
    """
    prompts = [_prompt(obj, where) for where, obj in read_objects(path)]
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    return prompts


def _prompt(obj: dict, where: str) -> BenchPrompt:
    if isinstance(obj.get("prompt"), str):
        return BenchPrompt(text=obj["prompt"])
    msgs = obj.get("messages")
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "role" in m for m in msgs):
        return BenchPrompt(messages=tuple(msgs))
    raise ValueError(f"{where}: needs \"prompt\" (a string) or \"messages\" (a list of "
                     f"{{\"role\", \"content\"}} objects)")
