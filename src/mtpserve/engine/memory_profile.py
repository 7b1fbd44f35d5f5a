"""Sizing the KV cache on a GPU from ``--gpu-memory-utilization`` after a profiled step.

Like vLLM's profiling run: with the weights (and recurrent-state slots) loaded, run one forward of
the largest step the scheduler can produce (``max_num_batched_tokens`` prompt tokens) over a
temporary KV cache, read the peak activation memory, and give the KV cache what is left of
``utilization x total`` after this engine's weights and that peak, and never so much that less
than ``min(1 - utilization, 0.1) x total`` stays free (another engine in the same process or on
the same GPU keeps what it holds, and this one keeps the slack its later allocations use). Admission then waits for free blocks instead of running out
of memory.
"""

from __future__ import annotations

import logging

import torch

from mtpserve.engine.kv_cache import KVCache
from mtpserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from mtpserve.engine.sequence import Sequence
from mtpserve.kernels.compile_ahead import compiling_ahead
from mtpserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Kept free besides the profiled peak: CUDA graphs' pool, sampler temporaries, allocator slack.
HEADROOM_BYTES = 1 << 30


def profile_peak_bytes(runner) -> int:
    """Peak activation bytes of one prefill step of ``max_num_batched_tokens`` tokens."""
    cfg = runner.config
    n = min(cfg.max_num_batched_tokens, runner.max_model_len)
    blocks = -(-n // runner.block_size)
    runner.kv_cache = KVCache(runner._kv_shape[0], blocks + 1, runner.block_size,
                              *runner._kv_shape[1:], runner.dtype, runner.device)
    seq = Sequence("__profile__", [0] * n, SamplingParams(), (), runner.max_model_len, None, None)
    seq.block_table = list(range(blocks))
    if runner.state_cache is not None:
        seq.state_slot = runner.state_cache.alloc()
    sched = SchedulerOutput([ScheduledSeq(seq, n, [])])
    with compiling_ahead() as ahead:   # a dry forward: the step's Triton kernels compile at once
        if ahead:
            runner.execute(runner.prepare(sched)[0])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    batch, _ = runner.prepare(sched)
    runner.execute(batch)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    if seq.state_slot is not None:
        runner.state_cache.free(seq.state_slot)
    del batch
    runner.kv_cache = None
    torch.cuda.empty_cache()
    return peak


def gpu_kv_blocks(runner) -> int:
    """KV blocks that fit in ``gpu_memory_utilization`` of the device.

    Raises:
        ValueError: not even one ``max_model_len`` sequence fits (the message says what to lower).
    """
    peak = profile_peak_bytes(runner)
    free, total = torch.cuda.mem_get_info(runner.device)
    weights = torch.cuda.memory_allocated(runner.device) - runner.mem_at_start
    # this engine's share of the device (vLLM's meaning), never more than is actually free
    from mtpserve.spec import target_kv_share

    # and where other processes hold memory, what is free less the slack a lone engine at 0.9
    # leaves (at most 1 - utilization): the allocations after this sizing (graphs, MTP buffers)
    # need it (H200: a second server at 0.9 beside one holding 62 GiB sized its KV cache to
    # the last free GiB and ran out of memory in its warm-up)
    util = runner.config.gpu_memory_utilization
    slack = min(1 - util, 0.1) * total
    budget = min(util * total - weights - peak,
                 free - slack - peak) - HEADROOM_BYTES - runner.reserve_bytes
    used = total - free

    per_block = runner.kv_bytes_per_block()
    share = target_kv_share(runner.config.speculative, runner._kv_shape[0])
    blocks = int(budget * share // per_block)
    need = -(-runner.max_model_len // runner.block_size)
    gib = 2 ** 30
    logger.info("GPU memory: %.1f GiB total, %.1f in use, step peak %.2f, KV cache %.1f GiB "
                "(%d blocks)", total / gib, used / gib, peak / gib, max(blocks, 0) * per_block / gib,
                blocks)
    if blocks < need:
        raise ValueError(f"the KV cache gets {max(blocks, 0)} blocks of {runner.block_size} tokens "
                         f"but one {runner.max_model_len}-token sequence needs {need}: raise "
                         f"--gpu-memory-utilization ({runner.config.gpu_memory_utilization}) or "
                         f"lower --max-model-len / --max-num-batched-tokens")
    return blocks
