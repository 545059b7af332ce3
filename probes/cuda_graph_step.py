"""A whole training step captured as one CUDA graph and replayed, as PyTorch's docs show it.

    gpudoctor run --out runs/graph -- python probes/cuda_graph_step.py --truth runs/graph.truth.json

Forward, backward and ``optimizer.step()`` (Adam with ``capturable=True``) are captured inside
``torch.cuda.graph``, after three warm-up steps on a side stream; the batches come from a
DataLoader and are copied into the static inputs before each replay. A profiler's hooks fire
during the capture (the forward, the optimizer step): any event query or sync of theirs there
invalidates the capture and the training fails. The truth is the final weights' SHA-256 and the
losses, so a run under the doctor can be compared bit for bit with a bare one. Needs CUDA:
without it, one line and exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="graph replays")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--truth", default=os.environ.get("GPUDOCTOR_PROBE_TRUTH"))
    args = p.parse_args(argv)
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if not torch.cuda.is_available():
        print("cuda_graph_step: CUDA is not available; run this probe on a machine with an NVIDIA GPU",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    d, n = args.width, args.rows
    model = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 1)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    loss_fn = torch.nn.MSELoss()
    data = TensorDataset(torch.randn(n * (args.steps + 3), d), torch.randn(n * (args.steps + 3), 1))
    loader = iter(DataLoader(data, batch_size=n, shuffle=False))
    static_x = torch.zeros(n, d, device="cuda")
    static_y = torch.zeros(n, 1, device="cuda")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as the docs require
        for _ in range(3):
            x, y = next(loader)
            static_x.copy_(x.to("cuda"))
            static_y.copy_(y.to("cuda"))
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    losses = []
    for _ in range(args.steps):
        x, y = next(loader)
        static_x.copy_(x.to("cuda"))
        static_y.copy_(y.to("cuda"))
        graph.replay()
        losses.append(static_loss.detach().clone())
    torch.cuda.synchronize()
    blob = b"".join(t.detach().cpu().numpy().tobytes() for t in model.state_dict().values())
    truth = {"probe": "cuda_graph_step", "replays": args.steps, "weights_sha256": hashlib.sha256(blob).hexdigest(),
             "losses": [float(v) for v in torch.stack(losses).cpu()],
             "weights_sum": float(sum(t.double().sum() for t in model.state_dict().values()))}
    print(json.dumps({k: v for k, v in truth.items() if k != "losses"}))
    if args.truth:
        with open(args.truth, "w") as fh:
            json.dump(truth, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
