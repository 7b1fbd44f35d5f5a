"""Token logprobs in the two OpenAI formats.

Chat (``choices[i].logprobs``): ``{"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}]}]}``. Text completions (legacy): ``{"tokens": [str],
"token_logprobs": [float], "top_logprobs": [{token: logprob}], "text_offset": [int]}``.

A token's ``bytes`` are its raw UTF-8 bytes (a token may hold part of a character); its ``token``
string is those bytes decoded with U+FFFD for incomplete characters. Byte-level BPE vocabularies
(GPT-2 / Llama-3 / SmolLM2 style, ``Ġ`` for space) are mapped back through the GPT-2 byte-to-unicode
table; SentencePiece vocabularies through ``▁`` -> space and ``<0xNN>`` byte tokens.
Logprobs below -9999 (and NaN) are reported as -9999.0 so that the JSON stays valid.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from mtpserve.outputs import TokenLogprob

MIN_LOGPROB = -9999.0
_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the
    other 68 bytes to U+0100 upwards in byte order (Radford et al., 2019, ``encoder.py``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_U2B = _gpt2_unicode_to_byte()


def clamp(lp: float) -> float:
    """A JSON-safe logprob: ``max(lp, -9999.0)``, NaN -> -9999.0."""
    return float(lp) if lp > MIN_LOGPROB else MIN_LOGPROB


class TokenStrings:
    """Token id -> (text, raw bytes) for one tokenizer, cached."""

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        probe = tokenizer.convert_ids_to_tokens(tokenizer.encode(" the", add_special_tokens=False))
        self._byte_level = bool(probe) and str(probe[0]).startswith("Ġ")
        self.bytes = lru_cache(maxsize=1 << 16)(self._bytes)

    def _bytes(self, token_id: int) -> bytes:
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return b""
        if token_id in self._special:
            return piece.encode()
        if self._byte_level and all(c in _U2B for c in piece):
            return bytes(_U2B[c] for c in piece)
        m = _SP_BYTE.match(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece.replace("▁", " ").encode()

    def text(self, token_id: int) -> str:
        """The token's text (U+FFFD where it holds an incomplete UTF-8 sequence)."""
        return self.bytes(token_id).decode("utf-8", errors="replace")


def chat_logprobs(strings: TokenStrings, lps: list[TokenLogprob]) -> dict:
    """Chat-format logprobs for ``lps`` (one entry per returned token)."""
    def entry(tid: int, lp: float) -> dict:
        b = strings.bytes(tid)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": clamp(lp), "bytes": list(b)}

    content = []
    for t in lps:
        e = entry(t.token_id, t.logprob)
        e["top_logprobs"] = [entry(tid, lp) for tid, lp in t.top]
        content.append(e)
    return {"content": content, "refusal": None}


class LegacyLogprobs:
    """Builds legacy (text-completion) logprobs, keeping ``text_offset`` across stream chunks.

    ``text_offset[i]`` is the character offset of token i in the choice's text, counted as the
    sum of the lengths of the earlier ``tokens`` strings, starting after the echoed prompt.
    """

    def __init__(self, strings: TokenStrings, start_offset: int = 0):
        self._strings = strings
        self._offset = start_offset

    def build(self, lps: list[TokenLogprob]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": []}
        for t in lps:
            s = self._strings.text(t.token_id)
            out["tokens"].append(s)
            out["token_logprobs"].append(clamp(t.logprob))
            out["top_logprobs"].append({self._strings.text(tid): clamp(lp) for tid, lp in t.top})
            out["text_offset"].append(self._offset)
            self._offset += len(s)
        return out
