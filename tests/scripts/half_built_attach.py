"""The attach payload run in a process that holds objects met mid-``__init__`` (a tokenizer and a
DataLoader whose attributes are not set yet) beside built ones: prints what it installed, as JSON."""

from __future__ import annotations

import json
import os
import sys

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerFast

from gpudoctor import hooks
from gpudoctor.attach import payload

half_tokenizer = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)  # attached inside its __init__
half_loader = DataLoader.__new__(DataLoader)
tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<pad>": 0, "a": 1}, unk_token="a")),
                                    pad_token="<pad>")
loader = DataLoader(list(range(8)), batch_size=4)
run_dir, control = sys.argv[1], sys.argv[2]
payload.attach(run_dir, control, os.getpid())
th = hooks.active_torch_hooks()
print(json.dumps({"status": sorted(os.listdir(control)), "pad_token_id": th.pad_token_id if th else None}))
payload.detach("done")
