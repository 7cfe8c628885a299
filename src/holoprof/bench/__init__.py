"""Benchmarks: ``iobench`` (read bandwidth of a dataset against readers, ``holoprof iobench``) and
``synth`` (generated runs of known size for scale tests)."""
