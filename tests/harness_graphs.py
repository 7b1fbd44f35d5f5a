"""CUDA-graph runners exercised on the CPU: every "graph" is replayed by running the model's
forward over the graph's static batch eagerly. Everything but the capture itself is exercised:
static batches, padding to the captured size, the scatter of a step's inputs into the static
buffers and the gather of its outputs. Attention goes through the per-token layout graphs use
(its plain-PyTorch reference on the CPU)."""

from __future__ import annotations

import torch

from mtpserve.engine.cuda_graph import _Graph


class EagerReplay:
    """Stands in for ``torch.cuda.CUDAGraph``: ``replay()`` runs the forward over the graph's
    static batch and writes its static outputs, as a replay would."""

    def __init__(self, graphs, g: _Graph):
        self.graphs, self.g = graphs, g

    @torch.inference_mode()
    def replay(self):
        hidden, logits = self.graphs._forward(self.g.batch)
        self.g.hidden.copy_(hidden)
        self.g.logits.copy_(logits)


@torch.inference_mode()
def eager_capture(graphs) -> dict:
    """Fill ``graphs`` (a CudaGraphRunner or subclass) as ``capture`` would, with EagerReplay
    graphs. Returns counters the runs update: ``steps`` replayed, ``mixed`` of them with
    sequences of different query lengths."""
    graphs.runner.triton_attention = True   # the step layout graphs take
    for key in graphs.keys():
        batch = graphs._static_batch(key)
        hidden, logits = graphs._forward(batch)
        g = _Graph(None, batch, hidden.clone(), logits.clone())
        g.graph = EagerReplay(graphs, g)
        graphs.graphs[key] = g
    counts = {"steps": 0, "mixed": 0}
    run = graphs.run

    def counted(batch, *args):
        counts["steps"] += 1
        counts["mixed"] += len(set(batch.query_lens_cpu)) > 1
        return run(batch, *args)

    graphs.run = counted
    graphs.runner.graphs = graphs
    return counts
