"""One module per CLI command; each exposes ``main(args) -> int``."""
