"""A pandas pipeline: read a CSV (plain reads, or memory-mapped), group, write Parquet.

python pandas_pipeline.py CSV OUT.parquet [mmap]; prints the sizes of what it read and wrote as JSON.
"""

import json
import os
import sys

import pandas as pd

src, dst = sys.argv[1], sys.argv[2]
df = pd.read_csv(src, memory_map=len(sys.argv) > 3 and sys.argv[3] == "mmap")
df.groupby("k")["v"].agg(["mean", "count"]).to_parquet(dst)
print(
    json.dumps({"read_bytes": os.path.getsize(src), "written_bytes": os.path.getsize(dst), "rows": len(df)})
)
