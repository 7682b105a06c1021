"""Runtime LoRA endpoint wire types, in vLLM's shapes."""

from __future__ import annotations

from pydantic import Field

from edgeserve.api.common.wire import ProtocolModel


class LoadLoraAdapterRequest(ProtocolModel):
    """POST /v1/load_lora_adapter: the name requests will choose the adapter by, and its GGUF
    file on the server."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoraAdapterRequest(ProtocolModel):
    """POST /v1/unload_lora_adapter: the adapter's name (vLLM's `lora_int_id` is ignored)."""

    lora_name: str = Field(min_length=1)
