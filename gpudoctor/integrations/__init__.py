"""Python API for exact, in-process numbers (Trainer/Lightning callbacks, loop hooks)."""
