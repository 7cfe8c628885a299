"""Atomic saves: write under a temporary name, rename into place (twice), read the result back; and
a file renamed while still open, then written again. Prints the final files' sizes as JSON."""

import json
import os
import sys

d = sys.argv[1]
final = os.path.join(d, "final.bin")
for i in range(2):
    tmp = os.path.join(d, f".tmp{i}")
    with open(tmp, "wb") as f:
        f.write(b"x" * 1000)
    os.replace(tmp, final)
with open(final, "rb") as f:
    f.read()
fd = os.open(os.path.join(d, "open.tmp"), os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b"abc")
os.rename(os.path.join(d, "open.tmp"), os.path.join(d, "open.bin"))
os.write(fd, b"def")
os.close(fd)
print(json.dumps({p: os.path.getsize(os.path.join(d, p)) for p in ("final.bin", "open.bin")}))
