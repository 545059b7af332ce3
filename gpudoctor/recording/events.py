"""Kinds of lines in ``events/<pid>.jsonl`` and ``samples/*.jsonl``.

Every line is one JSON object. Times ``t``/``t0`` are wall-clock epoch seconds
(``time.time()``), so events from different processes line up; durations
``dt``/``s`` are seconds measured with ``time.perf_counter``.

In-process events (key ``k``):

``proc``      once per hooked process: ``pid, ppid, rank, local_rank, world_size,
              argv`` (redacted), ``create_time`` (epoch), ``is_worker``, ``libs``
              ({package: version}), ``python``.
``span``      a timed interval: ``c`` category, ``t0``, ``dt``, ``name``.
              Categories: ``data_wait`` (blocked in ``DataLoader.__next__``),
              ``checkpoint`` (torch.save, save_pretrained, safetensors, Trainer
              checkpoints), ``eval`` (Trainer.evaluate, Lightning validation,
              ``gpudoctor.profile().eval()``), ``format`` (``datasets`` map/filter),
              ``data_load`` (``datasets.load_dataset``/``load_from_disk``),
              ``model_load`` (``from_pretrained``), ``save_side`` (a ``torch.save`` of
              an object without tensors, e.g. ``training_args.bin``: saving time, not a
              checkpoint), ``eval_loop`` (a hand-written loop's eval region: forward passes
              without backward, see :mod:`gpudoctor.hooks.eval_regions`). Only the
              outermost span of a category is written when calls nest.
``first_step`` ``t``: start of the first training step (first batch request from a
              DataLoader, or first forward of a module in training mode).
``step``      ``t`` (end of an optimizer step, or of a hand-written parameter update in a
              loop with no optimizer), ``n`` (1-based count), ``dt`` (time inside
              ``optimizer.step``; 0 for a hand-written update).
``loader``    a DataLoader iterator was created: ``id, num_workers, batch_size,
              pin_memory, prefetch_factor, persistent_workers, dataset``,
              ``params`` (the installed DataLoader's argument names).
``batch``     padding seen in a training batch: ``t, tokens, pad, seq_len``,
              ``lengths`` (non-pad length of each row).
``counter``   periodic totals since the previous counter line: ``t``, ``name``
              (``tokenize`` | ``fetch`` | ``eval_forwards``: forward passes inside
              ``eval_loop`` regions), ``calls``, ``s`` (seconds). Written every
              0.5 s while the process is young, then every age/60 s up to 10 s,
              at the first step and at exit (see :mod:`gpudoctor.hooks.writer`). ``fetch`` is the
              time a process spent producing batches (dataset ``__getitem__`` +
              collate), in the main process or in a DataLoader worker.
``torch_cfg`` at the first training forward: ``cuda`` (bool), ``device``, ``device_name``,
              ``device_capability`` ([major, minor]),
              ``matmul_precision``, ``allow_tf32``, ``cudnn_allow_tf32``,
              ``param_dtype``, ``autocast`` (bool), ``autocast_dtype``.
``model``     at the first training forward, when the model has a ``config.to_dict()``
              (Hugging Face): ``class``, ``params`` (parameter count), ``config`` (its numbers,
              switches and ``model_type`` only; read by ``gpudoctor replay RUN``).
``trainer``   Hugging Face Trainer seen: ``args`` (TrainingArguments.to_dict(),
              redacted; its keys are the installed version's field names),
              ``max_steps``, ``num_train_epochs``, ``version``.
``uncaught``  the exception that ended the process (``sys.excepthook``): ``t``, ``error`` (its
              type), ``message`` (redacted, short), ``frames`` (the last few, ``file:line in fn``).
``lightning_checkpoint`` a Lightning ``ModelCheckpoint`` was built: ``t``, ``args``
              (``every_n_train_steps``, ``every_n_epochs``, ``train_time_interval``, ``save_top_k``,
              ``save_weights_only``, ``save_last``, ``monitor``), ``params`` (the installed
              ``ModelCheckpoint.__init__``'s argument names), ``class``, ``version`` (Lightning's).
``cli``       the script's own options, so a fix can name its flag: ``style``
              (``argparse``: a parse, HfArgumentParser's included; ``globals``: literal
              module globals a configurator overrides from ``--key=value``), ``parser``,
              ``from_argv`` (parsed ``sys.argv``), ``args`` (redacted, when another list
              was parsed), ``options``: ``[{dest, flags, default, value, takes_value,
              const}]``, values redacted (see :mod:`gpudoctor.hooks.cli_hooks`).
``profiler``  a short torch.profiler window: ``t0, dt, steps``, ``dataloader_s``
              (time in DataLoader ``__next__`` events), ``cuda_kernel_s`` (null on CPU).
``exit``      the process is exiting normally: ``t``.
``detach``    ``attach`` took its hooks out of the process: ``t``.
``plan``      how long the training means to run, from the HF Trainer or Lightning
              (at train begin, or when ``attach`` adopts a Trainer mid-run): ``t,
              max_steps, num_train_epochs, global_step``. Older recordings call it
              ``hf_plan``; both are read.
``map_cache`` after each ``datasets.Dataset.map``: ``t``, ``state``: ``hit`` (its result was
              read from the datasets cache), ``miss`` (computed and now cached: the next
              launch can read it), ``none`` (an in-memory dataset, never cached).
``hook_error`` one of our hooks failed and switched off (the training went on): ``t``,
              ``where``, ``vital`` (the whole in-process recording stopped), ``error``,
              ``message`` (redacted). The report says so in a ``partial_recording`` note.

Sampler lines (no ``k``): see :mod:`gpudoctor.samplers.host` and
:mod:`gpudoctor.samplers.nvml` for the fields.
"""

from __future__ import annotations
