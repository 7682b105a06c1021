"""vLLM's runtime LoRA endpoints: POST /v1/load_lora_adapter and /v1/unload_lora_adapter."""
