"""mtpserve: an LLM inference server built around speculative decoding."""

from mtpserve.config import EngineConfig, SpeculativeConfig
from mtpserve.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "SamplingParams", "SpeculativeConfig"]
__version__ = "0.1.0"


def __getattr__(name):  # keep `import mtpserve` light: the engine loads torch models lazily
    if name == "LLM":
        from mtpserve.llm import LLM

        return LLM
    raise AttributeError(name)
