"""Write a safetensors file one tensor at a time (the ``safetensors`` package needs them all in memory)."""

from __future__ import annotations

import json
import struct
from typing import Iterable, Iterator

import torch

# safetensors dtype codes of the dtypes we write.
_DTYPE_CODES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def safetensors_header(specs: Iterable[tuple[str, tuple[int, ...], torch.dtype]]) -> bytes:
    """The 8-byte length plus JSON header for tensors laid out back to back in ``specs`` order.

    Format (huggingface/safetensors README): little-endian u64 header size, then a JSON object
    mapping each name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (byte offsets into the
    data section), padded with spaces to a multiple of 8 bytes.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dtype in specs:
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        header[name] = {"dtype": _DTYPE_CODES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path: str, specs: list[tuple[str, tuple[int, ...], torch.dtype]],
                      tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
    """Stream ``tensors`` (which must come in ``specs`` order, names, shapes and dtypes) into ``path``.

    Holds one tensor at a time. Returns the file size in bytes.

    Raises:
        ValueError: when a tensor does not match its spec, or the counts differ.
    """
    with open(path, "wb") as f:
        f.write(safetensors_header(specs))
        it = iter(tensors)
        for name, shape, dtype in specs:
            got_name, t = next(it, (None, None))
            if got_name != name or t is None or tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                got = None if t is None else (tuple(t.shape), t.dtype)
                raise ValueError(f"tensor {got_name!r} {got} does not match spec {name!r} {shape} {dtype}")
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy())  # raw little-endian bytes
        if next(it, None) is not None:
            raise ValueError("more tensors than specs")
        return f.tell()
