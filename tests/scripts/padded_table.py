"""A plain loop over a ``datasets`` table of tokenized rows (lengths 10-120, a few of 400), each
batch padded to 512 by its collate: padding_waste, with the cap's cut counted over every row.

    python padded_table.py OUT.json   # writes the table's true lengths for the test to compare
"""

import json
import random
import sys

import datasets
import torch

rng = random.Random(3)
lengths = [rng.randint(10, 120) for _ in range(1990)] + [400] * 10
table = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in lengths]}).shuffle(seed=1).select(range(1500))
with open(sys.argv[1], "w") as fh:
    json.dump([len(r) for r in table["input_ids"]], fh)


def collate(rows):
    ids = torch.zeros(len(rows), 512, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask}


model = torch.nn.Sequential(torch.nn.Embedding(8, 16), torch.nn.Linear(16, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, batch in enumerate(torch.utils.data.DataLoader(table, batch_size=8, collate_fn=collate)):
    model(batch["input_ids"]).mean().backward()
    opt.step()
    opt.zero_grad()
    if step == 40:
        break
