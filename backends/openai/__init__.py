"""Backends for engines kvgov did not build: any OpenAI-compatible server, vLLM, SGLang and
llama.cpp's llama-server, each read through its own routes for capacity and pressure."""

from __future__ import annotations

from backends.openai.backend import OpenAICompatibleBackend
from backends.openai.llamacpp import LlamaCppBackend
from backends.openai.sglang import SGLangBackend
from backends.openai.vllm import VLLMBackend

__all__ = ["LlamaCppBackend", "OpenAICompatibleBackend", "SGLangBackend", "VLLMBackend"]
