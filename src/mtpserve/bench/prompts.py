"""Built-in prompt sets for benchmarks and speculative-decoding tests.

Each set is a list of chat conversations (one user message). ``code_edit`` and ``summarization``
quote their input, which the answer largely copies: there prompt lookup (n-gram) drafting shines;
``chat`` is open-ended, where it rarely does.
"""

from __future__ import annotations

_CODE_SNIPPET = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age = line.strip().split(",")
            users.append({"name": name, "age": int(age)})
    return users


def oldest(users):
    best = None
    for u in users:
        if best is None or u["age"] > best["age"]:
            best = u
    return best
'''

_CLASS_SNIPPET = '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key):
        if key in self.counts:
            self.counts[key] = self.counts[key] + 1
        else:
            self.counts[key] = 1

    def most_common(self):
        return sorted(self.counts.items(), key=lambda kv: kv[1], reverse=True)
'''

_ARTICLE = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
    "Supporters said the lanes would make cycling safer and reduce traffic. Shop owners worried "
    "that removing parking spaces would hurt their business. After two hours of debate, the "
    "council voted five to two to build the lanes, with a review of their effect after one year."
)

CHAT = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a black hole is to a ten-year-old.",
    "Write a short poem about the sea.",
    "What are the benefits of regular exercise?",
    "How do I make a cup of green tea?",
    "Why is the sky blue?",
    "Suggest a name for a friendly robot.",
]
CODE = [
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    "Write a JavaScript function that returns the largest number in an array.",
    "Write a SQL query that counts the orders per customer.",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
]
CODE_EDIT = [
    f"Rename the function `oldest` to `find_oldest` in this code and return the whole code:\n\n{_CODE_SNIPPET}",
    f"Add type hints to this code and return the whole code:\n\n{_CODE_SNIPPET}",
    f"Add a docstring to every method of this class and return the whole class:\n\n{_CLASS_SNIPPET}",
    f"Replace `self.counts` with `self.table` everywhere in this class:\n\n{_CLASS_SNIPPET}",
]
SUMMARIZATION = [
    f"Summarize this article in two sentences:\n\n{_ARTICLE}",
    f"List the key facts of this article as bullet points:\n\n{_ARTICLE}",
]
REPETITIVE = [
    "Repeat this list exactly three times: apple, banana, cherry, date.",
    "Count from 1 to 30, separated by commas.",
    "Write the alphabet in capital letters, separated by spaces, twice.",
]
MULTILINGUAL = [
    "Explique la photosynthèse en une phrase.",
    "¿Cuál es la montaña más alta del mundo?",
    "Was ist die Hauptstadt von Deutschland?",
    "Translate 'good morning, my friend' into Spanish, German and Japanese.",
]

PROMPT_SETS: dict[str, list[str]] = {
    "chat": CHAT,
    "code": CODE,
    "code-edit": CODE_EDIT,
    "summarization": SUMMARIZATION,
    "repetitive": REPETITIVE,
    "multilingual": MULTILINGUAL,
}


def prompt_set(name: str) -> list[str]:
    """The user messages of a built-in set; raises ``KeyError`` naming the known sets."""
    try:
        return PROMPT_SETS[name]
    except KeyError:
        raise KeyError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}") from None


def as_messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
