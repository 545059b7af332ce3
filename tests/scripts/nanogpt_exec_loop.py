"""nanoGPT's train.py pattern in miniature: module globals, then exec(configurator.py).

A plain loop (no DataLoader) whose settings are overridden by ``--key=value``; used to
check that the doctor records them (``gpudoctor.hooks.cli_hooks.globals_event``).
"""

import os

eval_interval = 10
eval_iters = 200
batch_size = 4
learning_rate = 6e-4
wandb_api_key = "none"
max_iters = 20
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configurator.py")).read())  # noqa: SIM115
config = {k: globals()[k] for k in config_keys}
iter_num = 0

if __name__ == "__main__":
    import torch

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
    while iter_num < max_iters:
        if iter_num % eval_interval == 0:
            with torch.no_grad():
                for _ in range(eval_iters):
                    model(torch.randn(batch_size, 8))
        loss = model(torch.randn(batch_size, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        iter_num += 1
