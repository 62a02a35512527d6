"""p03: a generation service. Continuous batching (`scheduler`) over a paged KV cache
(`block_manager`, `kv_pool`, `paged_model`) in `engine`, served with an OpenAI-compatible HTTP
API (`server`, FastAPI + uvicorn) and Prometheus metrics named as vLLM's (`metrics`).

    python -m camplib.serving CHECKPOINT [--port 8000]      # see camplib/serving/__main__.py
"""
from camplib.serving.block_manager import BlockManager, OutOfBlocks
from camplib.serving.engine import Engine
from camplib.serving.scheduler import QueueFull, Scheduler
from camplib.serving.sequence import SamplingParams, Sequence, Status

__all__ = ["BlockManager", "OutOfBlocks", "Engine", "QueueFull", "Scheduler", "SamplingParams", "Sequence", "Status"]
