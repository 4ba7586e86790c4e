"""Tokenizer backends behind ``engine.tokenizer.Tokenizer``.

Two backends share one protocol (``TokenizerBackend``): ``TiktokenBackend`` for
``tiktoken:<encoding>`` specs, loaded strictly offline, and ``HFBackend`` for a local
folder with a Hugging Face tokenizer.json. Loaders return ``TokenizerParts`` (the backend
plus EOS/BOS ids, chat templates and template variables); ``Tokenizer`` puts them together.
Streaming decode goes through an ``IncrementalDecoder`` that never splits a character.
"""

from engine.tokenizers.backend import TokenizerBackend, TokenizerParts
from engine.tokenizers.hf_backend import HFBackend
from engine.tokenizers.hf_folder import load_hf_folder
from engine.tokenizers.stream import ByteStreamDecoder, IncrementalDecoder, WindowStreamDecoder
from engine.tokenizers.tiktoken_backend import TiktokenBackend, load_tiktoken

__all__ = [
    "ByteStreamDecoder",
    "HFBackend",
    "IncrementalDecoder",
    "TiktokenBackend",
    "TokenizerBackend",
    "TokenizerParts",
    "WindowStreamDecoder",
    "load_hf_folder",
    "load_tiktoken",
]
