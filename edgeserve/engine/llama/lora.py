"""LoRA adapters' weights in llama.cpp, and the set each context decodes under.

llama.cpp keeps a set of (adapter, scale) per context (`llama_set_adapters_lora`) and rebuilds
its compute graph when the set changes; it compares with the set it has, so setting the same
one again before every decode costs nothing. An adapter's weights are freed when it is unloaded,
once no context holds it, or else with the model.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

import llama_cpp.llama_cpp as lc

from edgeserve.engine.llama.native_log import first_complaint, native_complaints
from edgeserve.engine.types import AdapterSet
from edgeserve.errors import InvalidAdapter


class LoraWeights:
    """The loaded adapters of one model, by id (engine thread)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._handles: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return bool(self._handles)

    def load(self, adapter_id: int, path: str) -> None:
        """Load a LoRA GGUF as `adapter_id` (InvalidAdapter with llama.cpp's reason when it
        is not a LoRA adapter of this model)."""
        if not os.path.isfile(path):
            raise InvalidAdapter(f"{path} is not a file")
        with native_complaints() as complaints:
            handle = lc.llama_adapter_lora_init(self._model, path.encode())
        if not handle:
            reason = first_complaint(complaints).removeprefix("failed to apply lora adapter: ")
            raise InvalidAdapter(f"{path} is not a LoRA adapter of this model ({reason})")
        self._handles[adapter_id] = handle

    def load_named(self, adapters: Sequence[tuple[str, str]]) -> None:
        """Load (name, path) adapters as ids 0, 1, …; InvalidAdapter names the one that
        does not fit."""
        for adapter_id, (name, path) in enumerate(adapters):
            try:
                self.load(adapter_id, path)
            except InvalidAdapter as exc:
                raise InvalidAdapter(f"LoRA adapter {name}: {exc}") from None

    def free(self, adapter_id: int, contexts: list[Any]) -> None:
        """Free an adapter's weights, once the `contexts` that may hold it hold none."""
        handle = self._handles.pop(adapter_id, None)
        if handle is None:
            return
        for ctx in contexts:
            lc.llama_set_adapters_lora(ctx, None, 0, None)
        lc.llama_adapter_lora_free(handle)

    def apply(self, ctx: Any, adapters: AdapterSet) -> None:
        """Make `ctx` decode under `adapters` (a no-op when it already does, or when no
        adapter was ever loaded)."""
        if not self._handles and not adapters:
            return
        n = len(adapters)
        handles = (lc.llama_adapter_lora_p_ctypes * n)(
            *(self._handles[adapter_id] for adapter_id, _ in adapters)
        )
        scales = (ctypes.c_float * n)(*(scale for _, scale in adapters))
        lc.llama_set_adapters_lora(ctx, handles if n else None, n, scales if n else None)

    def forget(self) -> None:
        """Drop the handles without freeing them: freeing the model frees its adapters."""
        self._handles.clear()
