"""Exports: a run written in another tool's format (Chrome trace for Perfetto, TensorBoard logs).

Each export is written once against the engine seam (DuckDB, or Dask for runs that outgrow one
machine) and writes the same bytes on both."""
