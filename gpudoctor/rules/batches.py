"""Rules that look at the batches themselves: padding."""

from __future__ import annotations

from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.analysis.process import dynamic_padding_tokens
from gpudoctor.common import batchlengths
from gpudoctor.rules.account import Claim
from gpudoctor.rules.base import Finding, Fix, Rule, Table, pct
from gpudoctor.rules.names import names_for
from gpudoctor.rules.values import max_length_for, pad_multiple_for

MIN_PAD_FRACTION = 0.10
MIN_RECOVERABLE = 0.05


class PaddingWaste(Rule):
    name = "padding_waste"
    fires_when = 'pad tokens ≥ 10% and per-batch padding would save ≥ 5% of the tokens'
    fix_from = '`max_length` = observed p99 rounded up to the pad multiple (64/32/16/8, fitted to the rows), never above what is padded now; per-batch padding / `group_by_length` (names checked against the recorded TrainingArguments); packing; gain between linear token work and quadratic attention'

    def match(self, a: Analysis) -> Finding | None:
        batches = [b for p in a.procs for b in p.batches]
        pad = a.padding()
        frac = pad["pad_fraction"]
        if not batches or frac is None or frac < MIN_PAD_FRACTION:
            return None
        multiple = pad_multiple_for(pad["p50_length"])
        now, after = dynamic_padding_tokens(batches, multiple)
        recoverable = 1.0 - after / now if now else 0.0
        attention = _attention_saving(batches, multiple)
        packing = frac >= 0.5 and recoverable < 0.5 * frac  # lengths vary inside batches too
        waste = max(recoverable, frac if packing else 0.0)
        if waste < MIN_RECOVERABLE:
            return None
        names = names_for(a.primary)
        p99, longest_seen = pad["p99_length"], pad["max_length"]
        new_max = max_length_for(p99, longest_seen, multiple=multiple)
        truncate: dict[str, object] = {"truncation": True, "max_length": new_max} if new_max else {}
        if names.is_trainer:
            args: dict[str, object] = {}
            if names.has("train_sampling_strategy"):
                args["train_sampling_strategy"] = "group_by_length"
            elif names.has("group_by_length"):
                args["group_by_length"] = True
            tables = [Table(names.library, names.call, args),
                      Table("transformers tokenizer", "tokenizer", truncate),
                      Table("transformers DataCollatorWithPadding", "DataCollatorWithPadding",
                            {"pad_to_multiple_of": multiple})]
            snippet = (
                "tokenized = ds.map(lambda b: tokenizer(b['text'], truncation=True"
                + (f", max_length={new_max}" if new_max else "")
                + "), batched=True)  # no padding here\n"
                f"collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of={multiple})\n"
                "trainer = Trainer(..., data_collator=collator)"
            )
        else:
            tables = [Table("transformers tokenizer", "tokenizer",
                            {"padding": "longest", **truncate, "pad_to_multiple_of": multiple})]
            snippet = (
                "batch = tokenizer(texts, padding='longest', truncation=True"
                + (f", max_length={new_max}" if new_max else "")
                + f", pad_to_multiple_of={multiple}, return_tensors='pt')"
            )
        if packing:
            snippet += "\n# or pack several examples into each row (no padding at all):\n# see trl's packing=True / DataCollatorWithFlattening"
        return Finding(
            rule=self.name,
            title="Most of each batch is padding",
            # Fewer tokens computed: a share of all compute, compounding with faster math. Token
            # work is linear in length, attention quadratic: without the model's shape the real
            # saving lies between the two (packing's ``waste`` is the pad share, also linear).
            claims=[Claim("compute", waste, up_to=max(waste, attention) if not packing else None)],
            evidence=(
                f"{pct(frac)} of the tokens in {pad['batches_seen']} training batches are padding: rows are "
                f"padded to {longest_seen} while the real lengths have p50 {pad['p50_length']} and p99 {p99}. "
                f"Padding each batch to its longest row (multiple of {multiple}) would drop {pct(recoverable)} "
                "of the tokens computed."
            ),
            fix=Fix(
                summary=(
                    f"Pad per batch instead of to {longest_seen}"
                    + (f", and cap max_length at {new_max} (p99 rounded up to {multiple})" if new_max else "")
                    + (", or pack examples" if packing else "")
                    + "."
                ),
                snippet=snippet,
                **Table.main_and_also(tables),
            ),
            data={
                "pad_fraction": round(frac, 4),
                "tokens_now": now,
                "tokens_dynamic": after,
                "p99_length": p99,
                "max_length": longest_seen,
            },
        )


def _attention_saving(batches: list[dict[str, Any]], multiple: int) -> float:
    """Share of attention work (quadratic in row length) that per-batch padding removes."""
    now = after = 0
    for b in batches:
        top = batchlengths.longest(b)  # exact row count and longest, even when lengths is a sample
        seq = int(b["seq_len"])
        rows = batchlengths.rows(b) or 1
        longest = min(seq, -(-top // multiple) * multiple) if top is not None else seq
        now += rows * seq * seq
        after += rows * longest * longest
    return 1.0 - after / now if now else 0.0
